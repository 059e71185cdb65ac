"""How a cell's `python -m dpbench ARGS` is started: a new interpreter, a fork of a warm one, or a submitit job.

All run dpbench's own CLI entry point (Hydra, the exit code 2 of a refused configuration, results.json) in a
process of its own, so a cell's peak memory is its own. `fork` skips the interpreter start and the imports of
torch, Lightning and Hydra (about 10 s of CPU per cell here), which is most of a short cell's cost: a fork server
imports them once and runs nothing else, so the children start from a clean state.
"""

from __future__ import annotations

import importlib.util
import logging
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from dpbench.core.errors import ConfigurationError

log = logging.getLogger(__name__)
Launcher = Callable[[list[str], Path, dict[str, str] | None], int]


class Stopped(Exception):
    """The suite was stopped: no new cell starts."""


class RunningCells:
    """The cells being run now, each with the call that stops it: a stopped suite stops them all (with --jobs N
    they run in worker threads that only the main thread's stop can reach). Once stopped, a cell that registers
    is stopped at once, so none slips through between a worker's check and its launch."""

    def __init__(self) -> None:
        self._stops: dict[int, Callable[[], None]] = {}
        self._lock = threading.Lock()
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    def reset(self) -> None:
        with self._lock:
            self._stops.clear()
            self._stopped = False

    def add(self, key: int, stop: Callable[[], None]) -> None:
        with self._lock:
            if not self._stopped:
                self._stops[key] = stop
                return
        _call(stop)

    def discard(self, key: int) -> None:
        with self._lock:
            self._stops.pop(key, None)

    def stop_all(self) -> None:
        with self._lock:
            self._stopped = True
            stops = list(self._stops.values())
        for stop in stops:
            _call(stop)


def _call(stop: Callable[[], None]) -> None:
    """A stop that fails (the cell has just ended, scancel refused) must not keep the others from stopping."""
    try:
        stop()
    except Exception as error:  # logged, and the remaining cells still stop
        log.warning("could not stop a cell: %s", error)


RUNNING = RunningCells()


def launch_subprocess(args: list[str], log: Path, env: dict[str, str] | None) -> int:
    """`python -m dpbench ARGS` in a new interpreter; stdout and stderr go to `log`."""
    with log.open("w") as handle, subprocess.Popen([sys.executable, "-m", "dpbench", *args], stdout=handle,
                                                    stderr=subprocess.STDOUT, env=env) as process:
        RUNNING.add(id(process), process.terminate)
        try:
            return process.wait()
        finally:
            if process.poll() is None:
                process.terminate()
                process.wait()
            RUNNING.discard(id(process))


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
    context.set_forkserver_preload(["dpbench.cli", "dpbench.app.run"])
    process = context.Process(target=_forked_cell, args=(args, str(log), env))
    try:
        process.start()
        RUNNING.add(id(process), process.terminate)
        process.join()
    finally:  # the suite was stopped: its cell, a child of the fork server and not of the suite, stops with it
        if process.pid is not None and process.is_alive():
            process.terminate()
            process.join()
        RUNNING.discard(id(process))
    return process.exitcode


SUBMITIT_DEFAULTS = {"timeout_min": 720}
"""submitit's own time limit (2 minutes locally, 5 on SLURM) would kill most cells: 12 hours unless set."""
POLL_S = 5.0


def launch_submitit(args: list[str], log: Path, env: dict[str, str] | None, parameters: dict[str, Any]) -> int:
    """The cell as a submitit job (SLURM where `sbatch` is found, else a local process: submitit's own rule), with
    `parameters` for its executor (slurm_partition, timeout_min, gpus_per_node, ...). A stopped suite cancels it
    within POLL_S rather than waiting for submitit's own status checks."""
    job = _executor(log.parent / "submitit", parameters).submit(_child, args, log, env)
    cancel = partial(job.cancel, check=False)
    RUNNING.add(id(job), cancel)
    try:
        while not job.done():
            if RUNNING.stopped:
                raise Stopped(f"submitit job {job.job_id} cancelled")
            time.sleep(POLL_S)
        return job.result()
    except (KeyboardInterrupt, SystemExit, Stopped):
        _call(cancel)
        raise
    except Exception as error:  # the job itself failed (time limit, preemption, node failure): the cell failed
        with log.open("a") as handle:
            handle.write(f"\nsubmitit job {job.job_id} failed: {error}\n")
        return 1
    finally:
        RUNNING.discard(id(job))


def _executor(folder: Path, parameters: dict[str, Any]) -> Any:
    """A submitit AutoExecutor with dpbench's defaults under the user's parameters; a bad key or value (unknown,
    of the wrong type) is a ConfigurationError naming it."""
    import submitit

    executor = submitit.AutoExecutor(folder=folder)
    try:
        executor.update_parameters(**{"name": f"dpbench-{folder.parent.name}", **SUBMITIT_DEFAULTS, **parameters})
    except (NameError, TypeError, ValueError, AssertionError) as error:
        raise ConfigurationError(f"--submitit {', '.join(f'{k}={v}' for k, v in parameters.items())}: "
                                 f"{error or type(error).__name__}") from None
    return executor


LAUNCHERS: dict[str, Launcher] = {"subprocess": launch_subprocess}
if "forkserver" in multiprocessing.get_all_start_methods():
    LAUNCHERS["fork"] = launch_fork
DEFAULT_LAUNCHER = "fork" if "fork" in LAUNCHERS else "subprocess"
SUBMITIT = "submitit"
LAUNCHER_NAMES = sorted([*LAUNCHERS, SUBMITIT])


def make_launcher(name: str, parameters: dict[str, Any] | None = None) -> Launcher:
    """The launcher called `name`; only submitit takes parameters (its executor's)."""
    if name == SUBMITIT:
        if importlib.util.find_spec("submitit") is None:
            raise ConfigurationError("--launcher submitit needs the package submitit: pip install -e '.[sweeps]'")
        with tempfile.TemporaryDirectory() as folder:
            _executor(Path(folder) / "check", dict(parameters or {}))
        return partial(launch_submitit, parameters=dict(parameters or {}))
    if parameters:
        raise ConfigurationError(f"--submitit {', '.join(parameters)}: executor parameters need --launcher submitit")
    if name not in LAUNCHERS:
        raise ConfigurationError(f"unknown launcher {name!r}: one of {', '.join(LAUNCHER_NAMES)}")
    return LAUNCHERS[name]
