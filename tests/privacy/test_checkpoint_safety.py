"""No dpbench command runs code from a checkpoint it reads (design rule 8).

A `last.ckpt` is a pickle: one crafted by someone who can write to a shared run directory would run its code as
the user the moment it is unpickled. Each reader of a checkpoint (the resume check, Lightning's own restore inside
`fit`, the canary audit) is given one whose unpickling would create a file: the file is never created, and the
command refuses it in one line.
"""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dpbench.app.run as run_module
from dpbench.core.errors import ConfigurationError
from tests.helpers.cli import FAST, ROOT, dpbench

UNSAFE = "which no dpbench checkpoint holds"


class RunsCode:
    """What a crafted checkpoint holds: unpickling it runs a shell command (here: one that creates `marker`)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def write_crafted_checkpoint(path: Path, marker: Path) -> None:
    """A file shaped like a dpbench checkpoint (run state, weights) that also carries the payload."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"dpbench_run": {"plan": {}, "config": {}, "payload": RunsCode(marker)}, "state_dict": {}}, path)


def _assert_one_line_refusal(run: subprocess.CompletedProcess, prefix: str) -> None:
    assert run.returncode == 2, run.stderr[-3000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith(prefix)]
    assert len(errors) == 1 and UNSAFE in errors[0], run.stderr[-3000:]
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("resume", ["true", "auto"])
def test_resume_refuses_a_checkpoint_that_runs_code_and_changes_nothing(tmp_path, resume):
    run_dir, marker = tmp_path / "run", tmp_path / "code-ran"
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    write_crafted_checkpoint(checkpoint, marker)
    crafted = checkpoint.read_bytes()
    # also where the user's environment tells torch to unpickle anything it is not told otherwise
    run = dpbench("max_steps=2", f"resume={resume}", f"hydra.run.dir={run_dir}", *FAST,
                  env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"})
    assert not marker.exists()
    _assert_one_line_refusal(run, "dpbench: error:")
    assert checkpoint.read_bytes() == crafted  # resume=auto does not start over on top of it either
    assert not (run_dir / "results.json").exists() and not (run_dir / "csv").exists()


def test_lightnings_own_restore_refuses_it_too(tmp_path, monkeypatch, compose):
    """Lightning reads last.ckpt again inside `fit`: a file swapped in after the resume check (or any torch setting
    that would let it unpickle freely) must not run code there either. The real checkpoint the run writes first
    needs nothing outside torch's weights-only set (the allow-list): weights, the optimizer's and the strategy's
    state (GRAPE's projected Adam), the ledger, the secret randomness, RNG states and the run state."""
    cfg = compose(["max_steps=2", "batch_size=400", "privatizer=grape", "privatizer.rank=8", "optimizer=adam",
                   "privacy.secure_rng=true",
                   "logger.wandb=false", *FAST])
    run_module.run_experiment(cfg, tmp_path)
    written = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert {"state_dict", "optimizer_states", "dpbench", "dpbench_run"} <= set(written)
    assert isinstance(written["dpbench"]["privacy_randomness"]["root"], int)
    marker, read_saved_run = tmp_path / "code-ran", run_module.read_saved_run

    def read_then_swap(path: Path) -> run_module.SavedRun:
        saved = read_saved_run(path)
        write_crafted_checkpoint(path, marker)
        return saved

    monkeypatch.setattr(run_module, "read_saved_run", read_then_swap)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    cfg.resume, cfg.extend_run, cfg.max_steps = True, True, 4  # a finished run is only reopened to be extended
    with pytest.raises(Exception) as raised:  # noqa: B017 - the marker is checked first, then what was raised
        run_module.run_experiment(cfg, tmp_path)
    assert not marker.exists()
    assert raised.type is ConfigurationError and UNSAFE in str(raised.value)


def test_the_canary_audit_refuses_a_checkpoint_that_runs_code(tmp_path):
    run_dir, marker = tmp_path / "run", tmp_path / "code-ran"
    write_crafted_checkpoint(run_dir / "checkpoints" / "last.ckpt", marker)
    config = {"model": {"name": "word2vec", "vocab_size": 50, "dim": 4, "mode": "cbow", "tied": True},
              "data": {"canaries": 5, "canary_copies": 1, "canary_seed": 0}}
    (run_dir / "results.json").write_text(json.dumps({"privatizer": "sparse", "epsilon": 1.0, "config": config}))
    env = {**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    audit = subprocess.run([sys.executable, "-m", "dpbench.audit", str(run_dir), "--references", "10"], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=300)
    assert not marker.exists()
    _assert_one_line_refusal(audit, "dpbench.audit: error:")
