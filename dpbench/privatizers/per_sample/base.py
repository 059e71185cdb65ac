"""What every per-sample gradient engine returns, and the model checks they share."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from torch import Tensor, nn

from dpbench.core.errors import UnsupportedModelError
from dpbench.privatizers.per_sample.construction import refuse_in_place_layers

SAMPLE_MIXING_LAYERS = (nn.modules.batchnorm._BatchNorm, nn.SyncBatchNorm)


@dataclass
class ClippedSum:
    """Sum of clipped per-sample gradients, by parameter name, plus what the step logs."""

    grads: dict[str, Tensor]
    norms: Tensor
    losses: Tensor


def trainable_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """Named trainable parameters, each shared parameter once."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def refuse_sample_mixing_layers(model: nn.Module) -> None:
    """Per-sample gradients are meaningless when a layer mixes samples of the batch.

    BatchNorm normalizes with batch statistics while training, and in eval mode too without running statistics;
    the mode at attach time says nothing about the mode at a step (training switches it), so every one is refused.
    So is a layer whose forward changes a parameter in place (construction.refuse_in_place_layers).
    """
    refuse_in_place_layers(model)
    for name, module in model.named_modules():
        if isinstance(module, SAMPLE_MIXING_LAYERS):
            raise UnsupportedModelError(
                f"layer {name or type(model).__name__} ({type(module).__name__}) mixes samples of a batch through "
                "its batch statistics, so per-sample gradients and the privacy guarantee do not hold: replace it "
                "with GroupNorm or LayerNorm (e.g. nn.GroupNorm(min(32, C), C)) or remove it"
            )


def graph_nodes(losses: Tensor) -> Iterator[object]:
    """Every node of the autograd graph of `losses`, once each."""
    seen, pending = set(), [losses.grad_fn]
    while pending:
        node = pending.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        yield node
        pending.extend(child for child, _ in node.next_functions)
