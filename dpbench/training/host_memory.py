"""Host memory freed by a step stays with the process, so that the next step does not fault it in again.

glibc hands the free top of its heap back to the kernel once it passes a threshold that glibc adapts itself (twice
the largest mapped block freed so far), and maps blocks above another adaptive threshold afresh each time. A training
step frees its temporaries at its end, so under these defaults some processes give tens of MB back at every step and
fault them in again at the next: DP-SGD on the 26K CNN (batch 256, one thread, the 2-core AMD EPYC machine) took
73-94 ms in such steps (about 9,300 page faults) and 52 ms in the others, which is the non-private step's time.
Whether a process falls into it depends on the order of its first allocations, so it differs from run to run.

Fixed thresholds keep blocks up to the first of MMAP_THRESHOLDS that glibc takes in the heap, and up to
TRIM_THRESHOLD of its free top. The resident peak, which dpbench reports, is not raised by this; what a process held
at its peak is kept after it. Both must be set: setting either one turns glibc's adaptation off, and a trim threshold
alone leaves every block above 128 KiB mapped afresh (21,700 faults a step on the same CNN).
"""

from __future__ import annotations

import ctypes
import platform

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLDS = (64 << 20, 32 << 20)
"""Tried in order: some glibc versions refuse more than 32 MiB on 64-bit (HEAP_MAX_SIZE / 2); 2.36 takes 64."""
TRIM_THRESHOLD = 1 << 30

DEFAULTS = "allocator defaults"


def keep_freed_host_memory() -> str:
    """Fix glibc's thresholds for this process; returns what the host allocator now does, for the run's results."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return f"{DEFAULTS} (not glibc: left as it is)"
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mapped = next((size for size in MMAP_THRESHOLDS if mallopt(M_MMAP_THRESHOLD, size) == 1), None)
    if mapped is None:
        return f"{DEFAULTS} (glibc refused a fixed mmap threshold)"
    if mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        raise RuntimeError("glibc took a fixed mmap threshold but refused the trim threshold")
    return (f"glibc keeps freed memory: blocks up to {mapped >> 20} MiB from the heap, "
            f"its free top kept up to {TRIM_THRESHOLD >> 20} MiB")
