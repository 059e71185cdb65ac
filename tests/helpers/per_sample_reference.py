"""The reference every exactness test compares an engine against: one forward and one backward per sample."""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpbench.core.tasks import ClassificationTask
from dpbench.privatizers.per_sample import FunctorchEngine

TOLERANCE = 1e-6
TASK = ClassificationTask()


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


def check_exact(model: nn.Module, batch, other, looped: bool = False) -> None:
    """The functorch engine's per-sample gradients, norms and clipped sum against the loop; replacing one sample
    moves its norm only; `looped`: whether the engine had to leave vmap for its per-example loop."""
    engine = FunctorchEngine(model)
    reference = loop_gradients(model, batch)
    assert_matches_loop(engine.per_sample_gradients(TASK, batch), reference)
    norms = loop_norms(reference)
    clip = float(norms.median())
    result = engine.clipped_sum(TASK, batch, clip)
    torch.testing.assert_close(result.norms, norms, atol=1e-6, rtol=1e-6)
    for name in reference[0]:
        expected = sum(min(1.0, clip / (float(n) + 1e-6)) * r[name] for n, r in zip(norms, reference, strict=True))
        torch.testing.assert_close(result.grads[name], expected, atol=1e-6, rtol=1e-6)
    assert_only_the_replaced_norm_moves(lambda b: engine.clipped_sum(TASK, b, 1.0).norms, batch, other)
    assert engine.per_example_loop == looped
