"""Peak memory of a training phase: CUDA max_memory_reserved, or on CPU the resident high-water mark.

On CPU the kernel's VmHWM is reset (write 5 to /proc/self/clear_refs) when the phase starts and read when it ends;
the figure is the peak minus the resident size at the start. Memory the allocator kept from earlier work in the
same process hides new allocations, which is why dpbench runs measured multirun jobs in fresh processes.
"""

from __future__ import annotations

import resource
from pathlib import Path

import torch

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int | None:
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def resident_mb() -> float:
    kib = _status_kib("VmRSS")
    return (kib or 0) / 1024.0


def available_mb() -> float | None:
    """MemAvailable: what the process can still take before the host runs out (None where /proc is missing)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def data_segment_mb() -> float | None:
    """This process's data segment (VmData): what RLIMIT_DATA counts (None where /proc is missing)."""
    kib = _status_kib("VmData")
    return None if kib is None else kib / 1024.0


def data_limit_free_mb() -> float | None:
    """What the process may still map under its data-segment limit (`ulimit -d`, RLIMIT_DATA; None: no limit)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    used = data_segment_mb()
    if soft == resource.RLIM_INFINITY or used is None:
        return None
    return max(0.0, soft / 2**20 - used)


def free_mb(device: torch.device) -> float | None:
    """Memory still free where tensors on `device` live: the CUDA device's, else the host's, within the process's
    data-segment limit where one is set (None: unknown)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] / 2**20
    known = [mb for mb in (available_mb(), data_limit_free_mb()) if mb is not None]
    return min(known) if known else None


def high_water_mark_mb() -> float:
    """The process's peak resident size so far (VmHWM; ru_maxrss where /proc is missing)."""
    kib = _status_kib("VmHWM")
    return (kib if kib is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024.0


def _reset_high_water_mark() -> bool:
    try:
        CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


class PeakMemory:
    """Start before the measured phase, stop after it; `peak_mb` is the phase's peak above its baseline."""

    def __init__(self, device: torch.device):
        self.device = device
        self.baseline_mb = 0.0
        self.peak_mb: float | None = None
        self.max_memory_reserved_mb: float | None = None
        self.method = ""

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline_mb = torch.cuda.memory_reserved(self.device) / 2**20
            self.method = "cuda.max_memory_reserved"
            return
        self.baseline_mb = resident_mb()
        self.method = "VmHWM above VmRSS at start" if _reset_high_water_mark() else "ru_maxrss above VmRSS at start"

    def stop(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.max_memory_reserved_mb = torch.cuda.max_memory_reserved(self.device) / 2**20
            self.peak_mb = self.max_memory_reserved_mb
            return
        reset = not self.method.startswith("ru_maxrss")
        peak_mb = high_water_mark_mb() if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        self.peak_mb = max(0.0, peak_mb - self.baseline_mb)
