"""FSDP2 on CPU (gloo, 2 processes): the released update of a sharded step is the single-process clipped sum plus the
noise the ranks drew for their own shards, each shard noised once by its own rank; a sharded run killed mid-training
resumes to the uninterrupted run's steps and epsilon; privatizers that cannot shard are refused in one line."""

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import OmegaConf
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from dpbench.core.optim import OptimizerConfig
from dpbench.core.tasks import ClassificationTask
from dpbench.models.provenance import built_by_dpbench
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.base import StepContext
from dpbench.training.sharding import shard
from tests.helpers.cli import FAST, ROOT, dpbench, results

SIGMA, CLIP, BATCH, ROOT_SEED, STEP = 1.3, 0.5, 12, 5, 3


class _Heads(nn.Module):
    """Splits each sample's features into heads of 3 with a -1 that an empty batch cannot resolve (as OPT's attention
    reshape cannot): a rank with no sample must still run its forward on something."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], -1, 3).relu().reshape(x.shape[0], -1)


def _model() -> nn.Module:
    """9- and 3-row weights (uneven shards)."""
    torch.manual_seed(0)
    return built_by_dpbench(nn.Sequential(nn.Linear(6, 9), _Heads(), nn.LayerNorm(9), nn.Linear(9, 3)))


def _batch():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 6, generator=generator), torch.randint(0, 3, (BATCH,), generator=generator)


def _strategy():
    settings = PrivacySettings(CLIP, 0.1, SIGMA, PrivacyRandomness(ROOT_SEED))
    return make_strategy(OmegaConf.create({"name": "vanilla", "engine": "hooks"}), settings)


def _worker(rank: int, port: int, split: int, out) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        model = _model()
        shard(model, init_device_mesh("cpu", (2,)))
        strategy = _strategy()
        strategy.attach(model)
        inputs, targets = _batch()
        part = slice(0, split) if rank == 0 else slice(split, BATCH)  # rank 0 may hold no sample at all
        strategy.privatize(model, ClassificationTask(), (inputs[part], targets[part]), StepContext(STEP, BATCH, 2))
        out[rank] = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    finally:
        dist.destroy_process_group()


def _sharded_update(split: int) -> dict[str, torch.Tensor]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(_worker, args=(port, split, out), nprocs=2, join=True)
    torch.testing.assert_close(out[0], out[1], rtol=0, atol=0)  # every rank holds the same released update
    return out[0]


def _rank_noise(rank: int, shapes: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
    """What rank `rank` must have drawn for its rows of every parameter, in parameter order: an independent
    reconstruction from the documented key (step, rank) and FSDP2's dim-0 chunks."""
    draws = PrivacyRandomness(ROOT_SEED).draws("sharded_noise", STEP, rank)
    return {name: draws.normal(torch.chunk(torch.empty(shape), 2)[rank].shape, torch.float32).mul_(SIGMA * CLIP)
            for name, shape in shapes.items()}


@pytest.mark.parametrize("split", [0, 5, 6], ids=["rank0-empty", "uneven", "even"])
def test_a_sharded_step_releases_the_single_process_sum_plus_each_shards_own_noise(split):
    sharded = _sharded_update(split)
    model = _model()
    strategy = _strategy()
    strategy.attach(model)
    clipped = strategy.engine.clipped_sum(ClassificationTask(), _batch(), CLIP).grads  # one process, whole batch
    shapes = {name: p.shape for name, p in model.named_parameters()}
    noise = [_rank_noise(rank, shapes) for rank in (0, 1)]
    for name in shapes:
        expected = (clipped[name] + torch.cat([noise[0][name], noise[1][name]])) / BATCH
        torch.testing.assert_close(sharded[name], expected, rtol=1e-5, atol=1e-6)
    flat = [torch.cat([n.flatten() for n in rank_noise.values()]) for rank_noise in noise]
    assert not torch.isclose(flat[0][: len(flat[1])], flat[1][: len(flat[0])]).any()  # no two ranks share noise


def _grape(sigma: float):
    settings = PrivacySettings(CLIP, 0.1, sigma, PrivacyRandomness(ROOT_SEED))
    return make_strategy(OmegaConf.create({"name": "grape", "rank": 2}), settings)


def _grape_step(model: nn.Module, sigma: float, batch) -> dict[str, torch.Tensor]:
    """One GRAPE step with projected Adam; the parameters after it (gathered whole)."""
    strategy = _grape(sigma)
    strategy.attach(model)
    optimizer = strategy.configure_optimizer(model, OptimizerConfig(name="adam", lr=0.1))
    strategy.privatize(model, ClassificationTask(), batch, StepContext(STEP, BATCH, 2))
    strategy.apply_update(optimizer)
    return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for name, p in model.named_parameters()}


def _grape_worker(rank: int, port: int, sigma: float, out) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        model = _model()
        shard(model, init_device_mesh("cpu", (2,)))
        inputs, targets = _batch()
        part = slice(0, 5) if rank == 0 else slice(5, BATCH)
        out[rank] = _grape_step(model, sigma, (inputs[part], targets[part]))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("sigma", [0.0, SIGMA], ids=["noise-free", "noised"])
def test_a_sharded_grape_step_updates_every_rank_alike_and_as_one_process_does(sigma):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(_grape_worker, args=(port, sigma, out), nprocs=2, join=True)
    torch.testing.assert_close(out[0], out[1], rtol=0, atol=0)
    if sigma == 0.0:  # the same projected sums, the same projected Adam, the rows of each shard mapped back
        torch.testing.assert_close(out[0], _grape_step(_model(), sigma, _batch()), rtol=1e-5, atol=1e-6)
    else:
        assert any(not torch.equal(out[0][name], p) for name, p in _model().named_parameters())


STEPS = 12
ARGS = [f"max_steps={STEPS}", "batch_size=400", "privacy.epsilon=4", "trainer.checkpoint_every_n_steps=2",
        "trainer.devices=2", "trainer.strategy=fsdp", "trainer.accelerator=cpu", *FAST]


def _start(run_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "dpbench", *ARGS, f"hydra.run.dir={run_dir}"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _checkpointed_past(run_dir: Path, step: int) -> bool:
    log = run_dir / "dpbench.log"
    return log.exists() and any(f"checkpoint at step {s}:" in log.read_text() for s in range(step, STEPS, 2))


def test_a_sharded_run_killed_mid_training_resumes_to_the_uninterrupted_steps_and_epsilon(tmp_path):
    reference = dpbench(*ARGS, f"hydra.run.dir={tmp_path / 'reference'}", fresh_interpreter=True, timeout=600)
    assert reference.returncode == 0, reference.stderr[-3000:]
    run_dir = tmp_path / "killed"
    process, deadline = _start(run_dir), time.time() + 300
    while time.time() < deadline and process.poll() is None and not _checkpointed_past(run_dir, 4):
        time.sleep(0.05)
    assert process.poll() is None, "the run ended before its mid-training checkpoint"
    os.killpg(process.pid, signal.SIGKILL)  # both ranks, at once
    process.wait()
    assert not (run_dir / "results.json").exists()
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    assert checkpoint.is_dir() and {p.name for p in checkpoint.iterdir()} >= {"meta.pt", ".metadata"}
    assert len(list(checkpoint.glob("*.distcp"))) == 2  # one shard file per rank
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in [checkpoint, *checkpoint.iterdir()])
    resumed = dpbench(*ARGS, "resume=true", f"hydra.run.dir={run_dir}", fresh_interpreter=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected, got = results(tmp_path / "reference"), results(run_dir)
    assert got["steps"] == expected["steps"] == STEPS and 0 < got["resumed_from_step"] < STEPS
    assert got["epsilon"] == pytest.approx(expected["epsilon"], rel=1e-9)
    ledger = json.loads((run_dir / "privacy_ledger.json").read_text())
    assert ledger == json.loads((tmp_path / "reference" / "privacy_ledger.json").read_text())


def test_a_sharded_grape_run_resumes_with_its_projected_moments(tmp_path):
    grape = ["privatizer=grape", "privatizer.rank=4", "optimizer=adam", *ARGS[1:], f"hydra.run.dir={tmp_path}"]
    first = dpbench("max_steps=4", *grape, fresh_interpreter=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    extended = dpbench("max_steps=6", "resume=true", "extend_run=true", *grape, fresh_interpreter=True, timeout=600)
    assert extended.returncode == 0, extended.stderr[-3000:]
    record = results(tmp_path)
    assert record["steps"] == 6 and record["resumed_from_step"] == 4 and record["method"].startswith("DP-GRAPE")


def test_a_privatizer_that_cannot_shard_is_refused_in_one_line(tmp_path):
    run = dpbench("max_steps=2", "privatizer=jl", "trainer.devices=2", "trainer.strategy=fsdp",
                  "trainer.accelerator=cpu", *FAST, f"hydra.run.dir={tmp_path}", fresh_interpreter=True)
    assert run.returncode == 2
    assert "privatizer=jl does not support trainer.strategy=fsdp" in run.stderr
