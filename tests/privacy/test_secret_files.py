"""A run's secrets stay the user's (design rule 8): the checkpoint (it holds the privacy root) is 0600 in a 0700
directory whatever the umask, and an explicit privacy.seed, however it is spelled, is in no file a run, a refused
run or a sweep writes (W&B's offline files included)."""

import json
import os
import stat
from pathlib import Path

import torch
from omegaconf import OmegaConf

from dpbench.core.redaction import redact_saved_configs
from dpbench.training.checkpoint_io import AtomicCheckpointIO
from tests.helpers.cli import FAST, dpbench, results

SEED = 424242987
SPELLINGS = [f"+privacy.seed={SEED}", f"privacy.seed={SEED}", f"++privacy.seed={SEED}", f"privacy={{seed:{SEED}}}"]
"""Every way to set it on the command line, in one command (Hydra applies them in order; `+` needs it unset)."""
RUN = ["max_steps=2", "batch_size=400", "privacy.epsilon=4", *FAST]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _files_with_the_seed(directory: Path) -> list[str]:
    """Every file under `directory` whose name or content holds the seed's digits (checkpoints hold the root: they
    are the one place it belongs)."""
    digits = str(SEED)
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*")
                  if digits in path.name or (path.is_file() and path.suffix != ".ckpt"
                                             and digits.encode() in path.read_bytes()))


def _written(directory: Path) -> set[str]:
    return {str(path.relative_to(directory)) for path in directory.rglob("*") if path.is_file()}


def test_a_run_keeps_its_checkpoint_private_and_its_seed_out_of_every_file(tmp_path):
    previous = os.umask(0)  # the loosest umask: any file dpbench does not make private comes out world-readable
    try:
        run = dpbench(*RUN, *SPELLINGS, f"hydra.run.dir={tmp_path}", env={"WANDB_MODE": "offline"})
    finally:
        os.umask(previous)
    assert run.returncode == 0, run.stderr[-3000:]
    assert results(tmp_path)["privacy_seed"].startswith("explicit")
    assert _mode(tmp_path / "checkpoints") == 0o700 and _mode(tmp_path / "checkpoints" / "last.ckpt") == 0o600
    assert _written(tmp_path / "checkpoints") == {"last.ckpt"}
    written = _written(tmp_path)
    assert {".hydra/overrides.yaml", ".hydra/hydra.yaml", ".hydra/config.yaml", "results.json"} <= written
    assert any(name.startswith("wandb/offline-run-") and name.endswith(".wandb") for name in written)
    assert _files_with_the_seed(tmp_path) == []
    overrides = OmegaConf.load(tmp_path / ".hydra" / "overrides.yaml")
    assert list(overrides)[-len(SPELLINGS):] == ["+privacy.seed=<secret>", "privacy.seed=<secret>",
                                                     "++privacy.seed=<secret>", "privacy=<secret>"]


def test_a_refused_run_keeps_the_seed_out_of_every_file(tmp_path):
    run = dpbench(*RUN, "batch_size=100000", *SPELLINGS, f"hydra.run.dir={tmp_path}")
    assert run.returncode == 2 and "exceeds the training set size" in run.stderr, run.stderr[-3000:]
    assert ".hydra/hydra.yaml" in _written(tmp_path)
    assert _files_with_the_seed(tmp_path) == []


def test_a_sweep_keeps_the_seed_out_of_every_file_of_its_jobs_and_refusals(tmp_path):
    """The plain spelling swept as a list: the second job's seed is refused, with a message that quotes it."""
    others = [spelling for spelling in SPELLINGS if not spelling.startswith("privacy.seed")]
    sweep = dpbench("-m", *RUN, *others, f"privacy.seed={SEED},-{SEED}", f"hydra.sweep.dir={tmp_path}",
                    env={"WANDB_MODE": "offline"})
    assert "privacy.seed must be a non-negative integer" in sweep.stderr, sweep.stderr[-3000:]
    written = _written(tmp_path)
    assert "multirun.yaml" in written and any(name.endswith("results.json") for name in written)
    assert any(name.endswith(".wandb") for name in written)
    assert _files_with_the_seed(tmp_path) == []
    refused = [tmp_path / name for name in written if name.endswith("refused.json")]
    assert len(refused) == 1 and "got <secret>" in json.loads(refused[0].read_text())["error"]


def test_a_sweep_kept_in_a_config_file_has_its_swept_seeds_redacted(tmp_path):
    """`hydra.sweeper.params` (a sweep in sweeps/*.yaml, an Optuna search space) is copied into multirun.yaml and every
    job's hydra.yaml; the rewrite the CLI runs on those files replaces the seed's values, and only those."""
    params = {"privacy.seed": f"{SEED},{SEED + 1}", "privacy": f"choice({{seed:{SEED}}})", "privacy.epsilon": "1,3"}
    OmegaConf.save({"hydra": {"sweeper": {"params": params}}}, tmp_path / "multirun.yaml")
    redact_saved_configs(tmp_path)
    assert OmegaConf.load(tmp_path / "multirun.yaml").hydra.sweeper.params == {
        "privacy.seed": "<secret>", "privacy": "<secret>", "privacy.epsilon": "1,3"}


def test_the_checkpoint_is_private_from_its_first_byte_whatever_the_umask(tmp_path, monkeypatch):
    """The temporary file of the atomic write is created 0600 before anything is written into it, and a
    checkpoint directory left world-readable (an older dpbench) is closed at the next save."""
    directory = tmp_path / "checkpoints"
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    modes_while_writing = []
    save = torch.save

    def spy(obj, file, *args, **kwargs):
        try:
            modes_while_writing.append(stat.S_IMODE(os.fstat(file.fileno()).st_mode))
        except (AttributeError, OSError):  # not a file on disk: the mode it ends up with is set later, if at all
            modes_while_writing.append(None)
        return save(obj, file, *args, **kwargs)

    monkeypatch.setattr(torch, "save", spy)
    previous = os.umask(0)
    try:
        AtomicCheckpointIO().save_checkpoint({"root": 2**127}, directory / "last.ckpt")
    finally:
        os.umask(previous)
    assert modes_while_writing == [0o600]
    assert _mode(directory) == 0o700 and _mode(directory / "last.ckpt") == 0o600
    assert _written(directory) == {"last.ckpt"}
