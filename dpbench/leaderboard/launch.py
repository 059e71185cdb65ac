"""How a cell's `python -m dpbench ARGS` is started: a new interpreter, or a fork of a warm one.

Both run dpbench's own CLI entry point (Hydra, the exit code 2 of a refused configuration, results.json) in a
process of its own, so a cell's peak memory is its own. `fork` skips the interpreter start and the imports of
torch, Lightning and Hydra (about 10 s of CPU per cell here), which is most of a short cell's cost: a fork server
imports them once and runs nothing else, so the children start from a clean state.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

Launcher = Callable[[list[str], Path, dict[str, str] | None], int]


def launch_subprocess(args: list[str], log: Path, env: dict[str, str] | None) -> int:
    """`python -m dpbench ARGS` in a new interpreter; stdout and stderr go to `log`."""
    with log.open("w") as handle:
        return subprocess.run([sys.executable, "-m", "dpbench", *args], stdout=handle, stderr=subprocess.STDOUT,
                              env=env).returncode


def _child(args: list[str], log: Path, env: dict[str, str] | None) -> int:
    descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)
    # The parent's sys.stdout / sys.stderr may not be file descriptors 1 and 2 (pytest, notebooks): rebind them.
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    sys.argv = ["dpbench", *args]
    from dpbench.cli import main

    try:
        main()
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _forked_cell(args: list[str], log: str, env: dict[str, str] | None) -> None:
    sys.exit(_child(args, Path(log), env))


def launch_fork(args: list[str], log: Path, env: dict[str, str] | None) -> int:
    """The same CLI run forked from multiprocessing's fork server: a fresh interpreter that imports dpbench once
    and runs nothing else. Forking the caller itself can deadlock the child on a lock another thread held at the
    fork (torch's thread pools in a test process did)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["dpbench.cli", "dpbench.run"])
    process = context.Process(target=_forked_cell, args=(args, str(log), env))
    process.start()
    try:
        process.join()
    finally:  # the suite was stopped: its cell, a child of the fork server and not of the suite, stops with it
        if process.is_alive():
            process.terminate()
            process.join()
    return process.exitcode


LAUNCHERS: dict[str, Launcher] = {"subprocess": launch_subprocess}
if "forkserver" in multiprocessing.get_all_start_methods():
    LAUNCHERS["fork"] = launch_fork
DEFAULT_LAUNCHER = "fork" if "fork" in LAUNCHERS else "subprocess"
