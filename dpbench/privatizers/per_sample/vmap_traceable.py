"""Make a model traceable by vmap for the duration of one functorch call, with the same results.

- nn.RNN, nn.GRU and nn.LSTM run as plain tensor ops (recurrence.recurrent_forward): the fused kernels have no
  batching rule, and the native one writes in place into an unbatched state, which vmap refuses.
- Hugging Face's mask builders skip the mask when no token is padded, testing `padding_mask.all()`: a data-dependent
  branch vmap cannot take. Builders that always materialize the mask give the same attention without the branch.
- Scaled dot-product attention runs on its math kernel, which vmap batches (it loops the fused CPU kernel per sample).
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator

from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from dpbench.privatizers.per_sample.rnn_unrolled import RECURRENT_LAYERS, recurrent_forward

MASK_BUILDERS = ("sdpa", "eager")
"""Hugging Face attention implementations whose mask builder may skip the mask on a data-dependent test."""


@contextlib.contextmanager
def plain_recurrences(model: nn.Module) -> Iterator[None]:
    """Every recurrent layer's forward is recurrent_forward (an instance attribute shadows the class's method)."""
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, RECURRENT_LAYERS)]
    own = {m: vars(m)["forward"] for _, m in layers if "forward" in vars(m)}
    for name, layer in layers:
        layer.forward = functools.partial(recurrent_forward, layer, name=name or type(model).__name__)
    try:
        yield
    finally:
        for _, layer in layers:
            del layer.forward
            if layer in own:
                layer.forward = own[layer]


def _always_materialized(build_mask: Callable) -> Callable:
    @functools.wraps(build_mask)
    def build(*args, **kwargs):
        return build_mask(*args, **{**kwargs, "allow_is_causal_skip": False, "allow_is_bidirectional_skip": False})

    return build


@contextlib.contextmanager
def materialized_attention_masks() -> Iterator[None]:
    """Hugging Face's registered sdpa and eager mask builders, never skipping the mask (process-wide while active)."""
    masking = sys.modules.get("transformers.masking_utils")
    if masking is None:  # no Hugging Face model has been built in this process
        yield
        return
    builders = {key: masking.ALL_MASK_ATTENTION_FUNCTIONS[key] for key in MASK_BUILDERS}
    for key, build in builders.items():
        masking.AttentionMaskInterface.register(key, _always_materialized(build))
    try:
        yield
    finally:
        for key, build in builders.items():
            masking.AttentionMaskInterface.register(key, build)


@contextlib.contextmanager
def vmap_traceable(model: nn.Module) -> Iterator[None]:
    with plain_recurrences(model), materialized_attention_masks(), sdpa_kernel(SDPBackend.MATH):
        yield
