"""Data parallelism on CPU (gloo, 2 processes): the privatized update has the 1-process distribution."""

import json
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from dpbench.core.tasks import ClassificationTask
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privacy.sampling import PoissonBatchSampler
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.base import StepContext

SIGMA, CLIP, BATCH = 1.5, 0.5, 16


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(400, 250)


def _batch():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 400, generator=generator), torch.randint(0, 250, (BATCH,), generator=generator)


def _update(name: str, inputs, targets) -> torch.Tensor:
    model = _model()
    strategy = make_strategy(OmegaConf.create({"name": name}), PrivacySettings(CLIP, 0.1, SIGMA, PrivacyRandomness(3)))
    strategy.attach(model)
    strategy.privatize(model, ClassificationTask(), (inputs, targets), StepContext(0, float(BATCH)))
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def _worker(rank: int, port: int, name: str, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        inputs, targets = _batch()
        shard = slice(rank, None, 2)  # each rank holds half of the logical batch
        results[rank] = _update(name, inputs[shard], targets[shard])
    finally:
        dist.destroy_process_group()


def _two_process_update(name: str) -> list[torch.Tensor]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_worker, args=(port, name, results), nprocs=2, join=True)
    return [results[0], results[1]]


def _clipped_mean() -> torch.Tensor:
    model = _model()
    settings = PrivacySettings(CLIP, 0.1, SIGMA, PrivacyRandomness(3))
    strategy = make_strategy(OmegaConf.create({"name": "vanilla"}), settings)
    strategy.attach(model)
    clipped = strategy.engine.clipped_sum(ClassificationTask(), _batch(), CLIP).grads
    return torch.cat([clipped[n].flatten() for n, _ in model.named_parameters()]) / BATCH


def test_two_ranks_noise_once_and_match_the_single_process_distribution():
    two = _two_process_update("vanilla")
    torch.testing.assert_close(two[0], two[1])  # every rank applies the same update
    one = _update("vanilla", *_batch())
    signal = _clipped_mean()
    for update in (one, two[0]):
        noise = (update - signal) * BATCH
        assert abs(float(noise.mean())) < 0.02 * SIGMA * CLIP
        assert float(noise.std()) == pytest.approx(SIGMA * CLIP, rel=0.02)  # once, not sqrt(2) times


def test_two_ranks_nonprivate_equals_the_full_batch_mean():
    two = _two_process_update("nonprivate")
    torch.testing.assert_close(two[0], _update("nonprivate", *_batch()), atol=1e-6, rtol=1e-5)


def test_poisson_shards_are_disjoint_and_keep_the_rate():
    n, q, steps = 101, 0.25, 2000
    randomness = PrivacyRandomness(0)
    samplers = [PoissonBatchSampler(n, q, randomness, steps_per_epoch=steps, rank=r, world_size=2) for r in (0, 1)]
    counts = torch.zeros(n)
    for batch0, batch1 in zip(*samplers, strict=True):
        assert not set(batch0) & set(batch1)
        counts[batch0 + batch1] += 1
    assert torch.allclose(counts / steps, torch.full((n,), q), atol=0.04)


def test_the_cli_trains_under_lightning_ddp_and_accounts_each_step_once(tmp_path):
    """Two CPU ranks through Lightning: the ledger counts logical steps (not steps x ranks), and the reported epsilon
    is the composition of exactly those steps."""
    import json

    from dpbench.privacy.accountant import PrivacyAccountant
    from dpbench.privacy.mechanisms import SubsampledGaussian
    from tests.helpers.cli import FAST, dpbench, results

    run = dpbench("trainer.strategy=ddp", "trainer.devices=2", "trainer.accelerator=cpu", "max_steps=4",
                  "trainer.checkpoint=false", f"hydra.run.dir={tmp_path}", *FAST, fresh_interpreter=True)
    assert run.returncode == 0, run.stderr[-3000:]
    out = results(tmp_path)
    ledger = json.loads((tmp_path / "privacy_ledger.json").read_text())
    assert out["steps"] == ledger["steps"] == 4 and len(ledger["mechanisms"]) == 1
    composed = [(SubsampledGaussian(out["sampling_rate"], out["noise_multiplier"]), 4)]
    assert out["epsilon"] == pytest.approx(PrivacyAccountant().epsilon(composed, 1e-5).epsilon, rel=1e-6)
    assert out["epsilon"] <= 3.0 and 0.0 <= out["test_accuracy"] <= 1.0


def test_an_explicit_privacy_seed_reaches_every_rank_lightning_relaunches(tmp_path):
    """Lightning starts ranks 1.. by re-running the redacted command line: its seed override must still parse there,
    and those ranks take rank 0's root (broadcast at setup), so two runs with one seed draw the same batches and
    noise."""
    from tests.helpers.cli import FAST, dpbench, results

    args = ["trainer.strategy=ddp", "trainer.devices=2", "trainer.accelerator=cpu", "max_steps=3", "privacy.seed=7",
            "trainer.checkpoint=false", *FAST]
    runs = [dpbench(*args, f"hydra.run.dir={tmp_path / name}", fresh_interpreter=True) for name in ("a", "b")]
    assert all(run.returncode == 0 for run in runs), runs[0].stderr[-3000:]
    first, second = results(tmp_path / "a"), results(tmp_path / "b")
    assert first["test_accuracy"] == second["test_accuracy"] and first["test_loss"] == second["test_loss"]
    assert "7" not in json.dumps(first["config"]["privacy"]["seed"])
