"""Run `python -m dpbench` as a user would, in a subprocess."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from dpbench.training.checkpoint_io import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
FAST = ["trainer.enable_progress_bar=false", "eval_batch_size=1000"]


def dpbench(*args: str, timeout: int = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "dpbench", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def final_weights(run_dir: Path) -> torch.Tensor:
    """The model's parameters in the run's last checkpoint, flattened in module order."""
    state = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["state_dict"]
    return torch.cat([value.flatten() for key, value in state.items() if key.startswith("model.")])
