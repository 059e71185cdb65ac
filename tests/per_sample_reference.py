"""The reference every exactness test compares an engine against: one forward and one backward per sample."""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

TOLERANCE = 1e-6


def sample(inputs, index: int):
    """Sample `index` of a tensor or a dict of tensors, keeping a batch dimension of 1."""
    if isinstance(inputs, dict):
        return {key: value[index : index + 1] for key, value in inputs.items()}
    return inputs[index : index + 1]


def replace_sample(batch, index: int, source, source_index: int):
    """A copy of `batch` whose sample `index` is sample `source_index` of `source`."""
    inputs, targets = batch
    source_inputs, source_targets = source

    def replaced(value: Tensor, new: Tensor) -> Tensor:
        value = value.clone()
        value[index] = new[source_index]
        return value

    if isinstance(inputs, dict):
        inputs = {key: replaced(value, source_inputs[key]) for key, value in inputs.items()}
    else:
        inputs = replaced(inputs, source_inputs)
    return inputs, replaced(targets, source_targets)


def loop_gradients(model: nn.Module, batch) -> list[dict[str, Tensor]]:
    """Per-sample gradients of the cross-entropy, one forward/backward per sample (zero where a parameter is unused)."""
    inputs, targets = batch
    gradients = []
    for i in range(targets.shape[0]):
        model.zero_grad()
        F.cross_entropy(model(sample(inputs, i)), targets[i : i + 1]).backward()
        gradients.append({
            name: p.grad.clone() if p.grad is not None else torch.zeros_like(p)
            for name, p in model.named_parameters() if p.requires_grad
        })
    model.zero_grad()
    return gradients


def loop_norms(reference: list[dict[str, Tensor]]) -> Tensor:
    return torch.stack([torch.sqrt(sum(g.pow(2).sum() for g in r.values())) for r in reference])


def assert_matches_loop(per_sample: dict[str, Tensor], reference: list[dict[str, Tensor]]) -> None:
    assert set(per_sample) == set(reference[0])
    for i, expected in enumerate(reference):
        for name, gradient in expected.items():
            torch.testing.assert_close(per_sample[name][i], gradient, atol=TOLERANCE, rtol=TOLERANCE,
                                       msg=lambda m, i=i, name=name: f"sample {i}, {name}: {m}")


def assert_only_the_replaced_norm_moves(norms_of: Callable[[object], Tensor], batch, other, index: int = 1) -> None:
    """Replacing one sample must leave every other sample's per-sample gradient norm as it was."""
    before = norms_of(batch)
    after = norms_of(replace_sample(batch, index, other, index))
    keep = torch.arange(before.shape[0]) != index
    torch.testing.assert_close(after[keep], before[keep], atol=TOLERANCE, rtol=TOLERANCE)
    assert not torch.isclose(after[index], before[index], atol=TOLERANCE, rtol=TOLERANCE)
