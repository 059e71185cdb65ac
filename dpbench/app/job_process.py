"""One run in a fresh process of its own: a multirun job's peak memory is then its own (jobs share one otherwise).

The process leaves the launcher's process group before it runs anything, and hears SIGINT / SIGTERM only through
the launcher's `StopRelay` (see there why). Its outcome comes back as one of the errors a run in this process would
raise: `ConfigurationError`, `RunInterrupted`, or a RuntimeError with the job's traceback.
"""

from __future__ import annotations

import logging.config
import multiprocessing
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dpbench.app.stop_relay import RELAY, STOP_SIGNALS
from dpbench.core.errors import ConfigurationError, RunInterrupted


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(signum)


def _child(container: dict, run_dir: str, sweep_dir: str | None, job_logging: dict | None,
           outcome: multiprocessing.Queue, relayed: Any) -> None:
    os.setpgrp()  # out of the terminal's process group: signals come from the launcher only, once each
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)  # drops one still pending from the group (the mask may be inherited)
        signal.signal(signum, _raise_interrupt)  # as in the launcher's own process: stop outside training at once
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        if relayed.value:  # relayed while this process still ignored it
            raise KeyboardInterrupt(relayed.value)
        if job_logging:  # the launcher's Hydra job logging (console filter, the job's dpbench.log), here too
            logging.config.dictConfig(job_logging)
        from dpbench.app.run import run_experiment

        run_experiment(OmegaConf.create(container), Path(run_dir), Path(sweep_dir) if sweep_dir else None)
    except ConfigurationError as error:
        outcome.put(("config", str(error)))
        sys.exit(2)
    except RunInterrupted as interrupted:
        checkpoint = str(interrupted.checkpoint) if interrupted.checkpoint else None
        outcome.put(("interrupted", (interrupted.signum, interrupted.step, checkpoint)))
        sys.exit(interrupted.exit_code)
    except KeyboardInterrupt as interrupt:
        signum = interrupt.args[0] if interrupt.args else signal.SIGINT
        outcome.put(("interrupted", (signum, None, None)))
        sys.exit(128 + signum)
    except BaseException:
        outcome.put(("crash", traceback.format_exc()))
        sys.exit(1)


def run_in_fresh_process(
    cfg: DictConfig, run_dir: Path, sweep_dir: Path | None = None, job_logging: dict | None = None,
) -> None:
    """Run the job in a new process; raises what the run raised there. job_logging: the logging.config dict the
    job logs with (Hydra's job_logging, resolved), which a spawned process does not inherit."""
    context = multiprocessing.get_context("spawn")
    outcome = context.Queue()
    relayed = context.RawValue("i", 0)
    container = OmegaConf.to_container(cfg, resolve=True)
    sweep = str(sweep_dir) if sweep_dir is not None else None
    process = context.Process(target=_child, args=(container, str(run_dir), sweep, job_logging, outcome, relayed))
    with RELAY.running(process, relayed):
        process.join()
        received = RELAY.received or relayed.value
    if process.exitcode == 0:
        return
    kind, message = outcome.get(timeout=5) if not outcome.empty() else ("crash", f"exit code {process.exitcode}")
    if kind == "config":
        raise ConfigurationError(message)
    if kind == "interrupted":
        signum, step, checkpoint = message
        raise RunInterrupted(signum, step, Path(checkpoint) if checkpoint else None)
    if received:  # a second signal stopped it at once, wherever it was (Lightning exits 1 on KeyboardInterrupt)
        raise RunInterrupted(received, None, None)
    raise RuntimeError(f"the run in {run_dir} failed:\n{message}")
