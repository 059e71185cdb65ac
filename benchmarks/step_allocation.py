"""The peak of tensor memory that one benchmark step allocates on CPU, from the profiler's allocation events.

The resident high-water mark also holds freed memory that the allocator keeps between steps of different batch
sizes; it grew from 513 to 987 MB over 160 DP-SGD steps on the CNN while the live tensors stayed at 14 MB
(BENCHMARKS.md, 2026-11-27). The profiler sees every allocation and free instead: its running total over one step,
above where the step started, is what the step needs, as CUDA's max_memory_allocated would say. Only the benchmark
harness uses it: in dpbench's own runs, profiling a step printed kineto's lines and once ended a run stopped by SIGINT
with a segmentation fault (2026-11-27).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

MEMORY_EVENT = "[memory]"
TOTAL = "Total Allocated"
BYTES = "Bytes"


def step_allocated_mb(step: Callable[[], None]) -> float:
    """Run `step` under the profiler: the highest total of CPU tensor memory it allocated above its start, in MB."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as finished:
        step()
    return peak_above_start_mb(finished)


def peak_above_start_mb(finished: profile) -> float:
    """Highest "Total Allocated" of the trace's memory events above the total before the first of them (0 when the
    step allocated nothing)."""
    with tempfile.TemporaryDirectory() as directory:
        trace = Path(directory) / "trace.json"
        finished.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    memory = [event["args"] for event in events
              if event.get("name") == MEMORY_EVENT and TOTAL in event.get("args", {})]
    if not memory:
        return 0.0
    start = memory[0][TOTAL] - memory[0].get(BYTES, 0)
    return max(0.0, (max(args[TOTAL] for args in memory) - start) / 2**20)
