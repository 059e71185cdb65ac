"""Host memory freed by a step stays with the process, so that the next step does not fault it in again.

glibc hands the free top of its heap back to the kernel once it passes a threshold that glibc adapts itself (twice
the largest mapped block freed so far), and maps blocks above another adaptive threshold afresh each time. A training
step frees its temporaries at its end, so under these defaults some processes give tens of MB back at every step and
fault them in again at the next: DP-SGD on the 26K CNN (batch 256, one thread, the 2-core AMD EPYC machine) took
73-94 ms in such steps (about 9,300 page faults) and 52 ms in the others, which is the non-private step's time.
Whether a process falls into it depends on the order of its first allocations, so it differs from run to run.

Fixed thresholds keep blocks up to the first of MMAP_THRESHOLDS that glibc takes in the heap, and up to
TRIM_THRESHOLD of its free top. Both must be set: setting either one turns glibc's adaptation off, and a trim threshold
alone leaves every block above 128 KiB mapped afresh (21,700 faults a step on the same CNN).

It trades memory for time where steps allocate blocks of many sizes: the heap that now holds the large blocks
fragments across Poisson batches of different sizes, so the resident peak, which dpbench reports, rises and grows over
a run. DP-LoRA on MiniLM (batch 1024, 8 steps, one thread) took 25.1 s a step at an 8.5 GB peak against 34.5 s at
5.0 GB under glibc's defaults, whose cost is zeroing the pages it maps afresh (transparent huge pages cut the faults
28-fold but not the time: 36.8 s); over 84 steps its peak reached 12.9 GB (BENCHMARKS.md, 2026-11-28). A trim
threshold of 128 MiB kept 8.4 GB, so it is the heap's fragments, not its free top. The run's
trainer.keep_freed_host_memory=false keeps glibc's defaults.
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
