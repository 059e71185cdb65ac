"""Run `python -m dpbench` as a user would, each call in a process of its own.

A call forks from a server that has imported dpbench's CLI once (what the leaderboard's `fork` launcher does), then
runs the CLI's entry point with the call's arguments in the checkout: the interpreter's start and the imports of
torch, Lightning and Hydra, about 5 s of CPU, were most of a short run's cost. A call that sets environment variables
starts `python -m dpbench` itself, since a library may read its variables when it is imported (Hugging Face's
offline switches do), and the server imported them under the test process's environment; so does one with
`fresh_interpreter=True`, for a run that starts processes by re-running its own command line (Lightning's DDP
launcher re-runs `python -m dpbench`, which a forked child cannot name).
"""

import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from dpbench.training.checkpoint_io import load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
FAST = ["trainer.enable_progress_bar=false", "eval_batch_size=1000"]


def dpbench(*args: str, timeout: int = 300, env: dict[str, str] | None = None,
            fresh_interpreter: bool = False) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "dpbench", *args]
    environment = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                   **(env or {})}
    if env is not None or fresh_interpreter:
        return subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=timeout)
    return _forked(command, list(args), environment, timeout)


def _forked(command: list[str], args: list[str], env: dict[str, str], timeout: int) -> subprocess.CompletedProcess:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["dpbench.cli", "dpbench.app.run"])
    with tempfile.TemporaryDirectory() as streams:
        out, err = Path(streams, "stdout"), Path(streams, "stderr")
        out.touch()  # a child that dies before it opens them reads as one that wrote nothing
        err.touch()
        process = context.Process(target=_run_cli, args=(args, env, str(out), str(err)))
        process.start()
        process.join(timeout)
        timed_out = process.is_alive()
        if timed_out:
            process.kill()
            process.join()
        stdout, stderr = out.read_text(), err.read_text()
    if timed_out:
        raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(command, process.exitcode, stdout, stderr)


def _run_cli(args: list[str], env: dict[str, str], stdout: str, stderr: str) -> None:
    """The forked child: `python -m dpbench ARGS` from the checkout, in the caller's environment as it is now (the
    server's is that of its start), its streams to the two files."""
    for descriptor, path in ((1, stdout), (2, stderr)):  # the server's sys.stdout and sys.stderr write to these
        os.dup2(os.open(path, os.O_WRONLY | os.O_TRUNC), descriptor)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(ROOT)
    sys.argv = [str(ROOT / "dpbench" / "__main__.py"), *args]
    from dpbench.cli import main

    main()  # multiprocessing turns its SystemExit or exception into the exit code, as the interpreter would


def plan(*args: str, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    """`python -m dpbench.plan ARGS` in a process of its own, in the checkout (`pythonpath`: the PYTHONPATH it sees)."""
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-m", "dpbench.plan", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def final_weights(run_dir: Path) -> torch.Tensor:
    """The model's parameters in the run's last checkpoint, flattened in module order."""
    state = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["state_dict"]
    return torch.cat([value.flatten() for key, value in state.items() if key.startswith("model.")])
