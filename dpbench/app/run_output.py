"""What a run prints: dpbench's own lines, every warning from dpbench or the user's code, and the summary. Library
chatter (Lightning's INFO lines and adverts, deprecation warnings raised inside installed libraries) goes only to
the run's `dpbench.log`, where it is still there when something needs explaining."""

from __future__ import annotations

import logging
import os
import sysconfig
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

LIBRARY_WARNINGS = "dpbench.library_warnings"
"""The logger library warnings are demoted to (INFO): the console filter drops them, the log file keeps them."""

_OWN = Path(__file__).resolve().parent
_LIBRARIES = tuple({Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib", "stdlib")})


class ConsoleFilter(logging.Filter):
    """On the console handler (conf/hydra/job_logging/dpbench.yaml): dpbench's INFO lines and anyone's warnings;
    other libraries' INFO lines (Lightning's device report and adverts) stay in the log file."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == LIBRARY_WARNINGS:
            return False
        if not on_rank_zero():  # a DDP group prints once: its other ranks only their errors
            return record.levelno >= logging.ERROR
        return record.levelno >= logging.WARNING or record.name == "dpbench" or record.name.startswith("dpbench.")


def on_rank_zero() -> bool:
    """Whether this process is the first of its group (Lightning's launchers set the ranks in the environment of the
    processes they start)."""
    return all(os.environ.get(key, "0") == "0" for key in ("LOCAL_RANK", "NODE_RANK", "RANK"))


def from_a_library(filename: str) -> bool:
    """Raised inside an installed library (site-packages or the standard library), not in dpbench or user code."""
    path = Path(filename).resolve()
    return not path.is_relative_to(_OWN) and any(path.is_relative_to(root) for root in _LIBRARIES)


LIGHTNING_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")
"""Loggers that Lightning gives a console handler at import: `lightning` always (its INFO lines would print a second
time beside the root logger's), the other two where the root logger had no handler yet, and then without propagation
(a process that imported Lightning before logging was set up, as the leaderboard's fork server does)."""


def drop_lightning_console() -> None:
    """Lightning's records go through the root handlers (console filter, log file) only."""
    for name in LIGHTNING_LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if type(handler) is logging.StreamHandler:
                logger.removeHandler(handler)
                logger.propagate = True


@contextmanager
def library_warnings_to_log() -> Iterator[None]:
    """Within the block, a warning raised inside an installed library is an INFO record of `LIBRARY_WARNINGS`
    (in dpbench.log when logging is configured); dpbench's and the user's own warnings show as before."""
    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: TextIO | None = None, line: str | None = None) -> None:
            if from_a_library(filename):
                logging.getLogger(LIBRARY_WARNINGS).info("%s:%d: %s: %s", filename, lineno, category.__name__, message)
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield

