"""How a cell's `python -m dpbench ARGS` is started: a new interpreter, or a fork of a warm one.

Both run dpbench's own CLI entry point (Hydra, the exit code 2 of a refused configuration, results.json) in a
process of its own, so a cell's peak memory is its own. `fork` skips the interpreter start and the imports of
torch, Lightning and Hydra (about 10 s of CPU per cell here), which is most of a short cell's cost; the parent
imports them once and never runs a tensor op or touches CUDA, so the children start from a clean state.
"""

from __future__ import annotations

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


def launch_fork(args: list[str], log: Path, env: dict[str, str] | None) -> int:
    """The same CLI run in a forked child of this (already warm) interpreter; its exit code."""
    import dpbench.cli  # noqa: F401  (imported once here, inherited by every child)
    import dpbench.run  # noqa: F401

    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = _child(args, log, env)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


LAUNCHERS: dict[str, Launcher] = {"subprocess": launch_subprocess}
if hasattr(os, "fork"):
    LAUNCHERS["fork"] = launch_fork
DEFAULT_LAUNCHER = "fork" if "fork" in LAUNCHERS else "subprocess"
