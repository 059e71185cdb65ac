"""What a run prints: dpbench's own lines, every warning from dpbench or the user's code, and the summary. Library
chatter (Lightning's INFO lines and adverts, deprecation warnings raised inside installed libraries) goes only to
the run's `dpbench.log`, where it is still there when something needs explaining."""

from __future__ import annotations

import logging
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
        return record.levelno >= logging.WARNING or record.name == "dpbench" or record.name.startswith("dpbench.")


def from_a_library(filename: str) -> bool:
    """Raised inside an installed library (site-packages or the standard library), not in dpbench or user code."""
    path = Path(filename).resolve()
    return not path.is_relative_to(_OWN) and any(path.is_relative_to(root) for root in _LIBRARIES)


def drop_lightning_console() -> None:
    """Lightning adds a console handler of its own at import, which prints its INFO lines a second time beside the
    root logger's: its records go through the root handlers (console filter, log file) only."""
    lightning = logging.getLogger("lightning")
    for handler in list(lightning.handlers):
        if type(handler) is logging.StreamHandler:
            lightning.removeHandler(handler)


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

