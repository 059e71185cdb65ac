"""SIGINT / SIGTERM in the process that launches jobs (a sweep, or a run with profiler.fresh_process=always).

A terminal's Ctrl-C, and a cluster's SIGTERM to a process group, reach every process of the group. A job process in
that group would get each signal twice, once directly and once relayed, and the second stops a run at once, before
its checkpoint. So each job process leaves the group (`job_process`) and hears the launcher's signals only through
`StopRelay`: exactly once per signal the launcher gets. The first is recorded (no new job starts) and relayed to the
job in flight, which checkpoints and stops as a single run does; a second is relayed too, and stops it at once.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRelay:
    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        self._process: BaseProcess | None = None
        self._flag: Any = None

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def install(self) -> bool:
        """Take SIGINT / SIGTERM (main thread only); False when already installed or not possible here."""
        if self.installed or threading.current_thread() is not threading.main_thread():
            return False
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)
        return True

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        self.received = None

    @contextmanager
    def running(self, process: BaseProcess, flag: Any) -> Iterator[None]:
        """Start `process` and relay signals to it until the block ends. It starts with both signals ignored (a
        disposition that survives exec) until it has left the process group; `flag` (a shared int) carries a
        signal relayed while it was still ignoring them."""
        installed_here = self.install()
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # what arrives meanwhile waits, then is relayed
        try:
            for signum in STOP_SIGNALS:
                signal.signal(signum, signal.SIG_IGN)
            try:
                process.start()
            finally:
                self._process, self._flag = process, flag
                for signum in STOP_SIGNALS:
                    signal.signal(signum, self._on_signal)
            if self.received is not None:  # came after the launcher's last look, before the job started
                self._relay(self.received)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        try:
            yield
        finally:
            self._process = self._flag = None
            if installed_here:
                self.restore()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        first = self.received is None
        if first:
            self.received = signum
        if self._relay(signum):
            return
        if first:
            return  # between jobs: recorded, and no new job starts
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def _relay(self, signum: int) -> bool:
        """Pass the signal to the job in flight, if there is one."""
        process = self._process
        if process is None or process.pid is None:
            return False
        if self._flag is not None and not self._flag.value:
            self._flag.value = signum
        try:
            os.kill(process.pid, signum)
        except ProcessLookupError:  # it has just ended
            pass
        return True


RELAY = StopRelay()
"""The one relay of this process: the sweep installs it for its whole length."""
