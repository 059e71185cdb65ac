"""bf16-mixed: the model's forward runs at bf16, every quantity that bounds or releases a sample's contribution is
float32. Checked through real steps (`make_private`'s step under autocast, a Lightning Trainer at bf16-mixed, the
CLI): the add-one sensitivity of the clipped sum stays at most C for a sample with a huge gradient, the sum is
float32 and within 1% of the fp32 step's on the same batch, and what cannot keep that is refused in one line."""

import copy
import json

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import dpbench
from dpbench.core.errors import ConfigurationError
from dpbench.privacy.randomness import PrivacyRandomness
from tests.helpers.cli import FAST
from tests.helpers.cli import dpbench as run_cli

CLIP, BATCH = 1.0, 16
BF16_SUM_TOLERANCE = 1e-2
"""Relative distance allowed between the bf16-mixed and the fp32 clipped sums of one batch (bf16 keeps 8 bits)."""

PRIVATIZERS = {
    "vanilla (ghost norms)": ({"name": "vanilla", "engine": "hooks"}, "sgd"),
    "vanilla (functorch)": ({"name": "vanilla", "engine": "functorch"}, "sgd"),
    "grape": ({"name": "grape", "rank": 4}, "adam"),
    "dp_galore": ({"name": "dp_galore", "rank": 4}, "adam"),
    "d2p2": ({"name": "d2p2", "dim": 50}, "sgd"),
}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(400, 32), nn.ReLU(), nn.LayerNorm(32),
                         nn.Linear(32, 4))


def _data() -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(64, 1, 12, 12, generator=generator)
    inputs[0] *= 1e4  # a sample whose gradient is far above C
    return TensorDataset(inputs, torch.randint(0, 4, (64,), generator=generator))


def _clipped_sum(privatizer: dict, optimizer: str, batch, bf16: bool) -> dict[str, torch.Tensor]:
    """The strategy's accumulated clipped sums (pre-noise) of one real step, read as finalize starts."""
    data = _data()
    model = copy.deepcopy(_model())
    loader = dpbench.poisson_loader(data, BATCH, PrivacyRandomness(7))
    training = dpbench.make_private(model, dpbench.OptimizerConfig(name=optimizer, lr=0.1), loader, privatizer,
                                    noise_multiplier=1.0, clip_norm=CLIP, steps=2)
    strategy, captured = training.strategy, {}
    finalize = strategy.finalize

    def capture(model, ctx):
        captured.update({name: total.clone() for name, total in strategy._sums.items()})
        return finalize(model, ctx)

    strategy.finalize = capture
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        training.step(batch)
    return captured


def _flat(sums: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([sums[name].flatten() for name in sorted(sums)])


@pytest.mark.parametrize("label", PRIVATIZERS)
def test_bf16_sums_are_float32_bounded_by_c_and_close_to_fp32(label):
    privatizer, optimizer = PRIVATIZERS[label]
    inputs, targets = _data().tensors
    full, without_huge = (inputs[:BATCH], targets[:BATCH]), (inputs[1:BATCH], targets[1:BATCH])
    bf16 = _clipped_sum(privatizer, optimizer, full, bf16=True)
    assert bf16 and all(total.dtype == torch.float32 for total in bf16.values())
    sensitivity = float((_flat(bf16) - _flat(_clipped_sum(privatizer, optimizer, without_huge, bf16=True))).norm())
    assert sensitivity <= CLIP * (1 + 1e-6)
    fp32 = _flat(_clipped_sum(privatizer, optimizer, full, bf16=False))
    distance = float((_flat(bf16) - fp32).norm() / fp32.norm())
    assert 0 < distance < BF16_SUM_TOLERANCE  # nonzero: the forward did run at bf16


def _toy_bundle() -> dpbench.DataBundle:
    x = torch.randn(300, 6)
    y = (x[:, 0] > 0).long()
    return dpbench.DataBundle("toy", dpbench.TensorSplit(x[:200], y[:200]), dpbench.TensorSplit(x[200:], y[200:]),
                              num_classes=2)


def test_a_bf16_mixed_trainer_runs_the_forward_at_bf16_and_clips_every_step_in_float32():
    """Over 2.5 epochs of a real Trainer at bf16-mixed, with a tenth of the samples scaled by 1e4: every step's
    clipped sum is float32 and no larger than C times the samples it summed (each contribution at most C). Seeded
    (data, weights, batches and checked samples), so that it runs the same steps on every machine."""
    torch.manual_seed(0)
    data = _toy_bundle()
    data.train.features[:20] *= 1e4
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    steps = 25  # 10 steps an epoch
    module, datamodule = dpbench.make_private_module(model, data, "vanilla",
                                                     optimizer=dpbench.OptimizerConfig(lr=0.1), batch_size=20,
                                                     steps=steps, target_epsilon=3.0, clip_norm=CLIP,
                                                     privacy_seed=3)
    strategy, sum_dtypes, summed, seen, forward_dtypes = module.strategy, set(), [], [0], set()
    accumulate, finalize, per_sample_loss = strategy.accumulate, strategy.finalize, module.task.per_sample_loss

    def recording(forward, batch):
        def recorded(inputs):
            outputs = forward(inputs)
            forward_dtypes.add(outputs.dtype)
            return outputs

        return per_sample_loss(recorded, batch)

    def count(model, task, batch, ctx):
        seen[0] += len(batch[1])
        return accumulate(model, task, batch, ctx)

    def capture(model, ctx):
        sum_dtypes.update(total.dtype for total in strategy._sums.values())
        norm = float(torch.cat([total.flatten() for total in strategy._sums.values()]).norm()) if strategy._sums \
            else 0.0
        summed.append((norm, seen[0]))
        seen[0] = 0
        return finalize(model, ctx)

    strategy.accumulate, strategy.finalize, module.task.per_sample_loss = count, capture, recording
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", precision="bf16-mixed", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        use_distributed_sampler=False, num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(module, datamodule=datamodule)
    assert module.ledger.steps == steps and trainer.current_epoch >= 2 and len(summed) == steps
    assert torch.bfloat16 in forward_dtypes and sum_dtypes == {torch.float32}
    assert all(norm <= CLIP * samples * (1 + 1e-6) for norm, samples in summed)
    assert max(norm for norm, _ in summed) > 0.5 * CLIP  # the huge samples were in the steps, clipped to C
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())


def _loop(privatizer: str = "vanilla", model: nn.Module | None = None):
    model = model or nn.Linear(6, 2)
    loader = dpbench.poisson_loader(TensorDataset(torch.randn(100, 6), torch.randint(0, 2, (100,))), 10)
    optimizer = dpbench.OptimizerConfig(name="adam" if privatizer == "grape" else "sgd", lr=0.1)
    training = dpbench.make_private(model, optimizer, loader, privatizer, noise_multiplier=1.0, steps=2)
    return training, next(iter(loader))


def test_fp16_autocast_is_refused_in_a_step():
    training, batch = _loop()
    with torch.autocast("cpu", dtype=torch.float16), pytest.raises(ConfigurationError, match="fp16.*bf16"):
        training.step(batch)
    assert training.ledger.steps == 0


def test_a_privatizer_without_mixed_precision_is_refused_naming_those_with_it():
    training, batch = _loop("jl")
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(
            ConfigurationError, match=r"privatizer=jl does not support .*bf16-mixed.*vanilla") as error:
        training.step(batch)
    assert "\n" not in str(error.value) and training.ledger.steps == 0


def test_half_precision_weights_are_refused_before_a_step():
    training, batch = _loop(model=nn.Linear(6, 2).to(torch.bfloat16))
    with pytest.raises(ConfigurationError, match="weight.*half precision.*bf16-mixed"):
        training.step((batch[0].to(torch.bfloat16), batch[1]))
    assert training.ledger.steps == 0


def test_the_cli_records_the_precision_and_labels_the_method(tmp_path):
    done = run_cli("max_steps=2", "batch_size=500", "privacy.epsilon=4", "trainer.checkpoint=false",
                   "trainer.precision=bf16-mixed", *FAST, f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["precision"] == "bf16-mixed" and results["method"] == "DP-SGD (bf16)"
    refused = run_cli("max_steps=2", "privatizer=jl", "trainer.precision=bf16-mixed", *FAST,
                      f"hydra.run.dir={tmp_path / 'jl'}")
    assert refused.returncode == 2 and "privatizer=jl does not support trainer.precision=bf16-mixed" in refused.stderr
