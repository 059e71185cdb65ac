"""Throughput and peak-memory measurement of training runs."""

from dpbench.profiling.callback import ProfilerCallback
from dpbench.profiling.memory import PeakMemory

__all__ = ["PeakMemory", "ProfilerCallback"]
