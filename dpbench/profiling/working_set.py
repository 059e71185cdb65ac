"""A CPU run's working set: the peak of the bytes its allocations hold live, not what the allocator keeps.

The resident high-water mark (VmHWM) counts what glibc keeps of freed memory (all of it under
`trainer.keep_freed_host_memory=true`), what other code mapped and how the heap fragmented, so two runs of one method
read differently. glibc's own count of the bytes in use (`mallinfo2`: allocated chunks, `uordblks`, plus mmapped
ones, `hblkhd`) does not move with its retention policy: freed memory it keeps is free, not in use. The peak is read
after every operator (a TorchDispatchMode, which sees the backward's operators too, on the thread that runs them):
about 0.5 us a read, but the Python dispatch slows each operator, so the profiler reads it only on the warm-up
steps, which the throughput leaves out. What it counts: every malloc'd byte in use (tensors, and the buffers the
process allocates for them); not Python's small-object arenas (mmapped by pymalloc, not malloc) nor operator
workspaces freed within one operator.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


@cache
def _mallinfo2() -> Any | None:
    """glibc's mallinfo2 (2.33 and later), or None on another C library."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        function = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    function.restype = _MallInfo2
    return function


def in_use_bytes() -> int | None:
    """Bytes malloc has handed out and not had back (None where glibc's mallinfo2 is missing)."""
    function = _mallinfo2()
    if function is None:
        return None
    info = function()
    return int(info.uordblks + info.hblkhd)


class PeakInUse(TorchDispatchMode):
    """Within the block, the largest in_use_bytes() seen after any operator (and at its entry and exit)."""

    def __init__(self) -> None:
        super().__init__()
        self.peak = in_use_bytes() or 0

    def _read(self) -> None:
        now = in_use_bytes() or 0
        if now > self.peak:
            self.peak = now

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self._read()
        return out

    def __exit__(self, *exc: object) -> None:
        self._read()
        super().__exit__(*exc)
