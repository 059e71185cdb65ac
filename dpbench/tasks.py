"""Moved to dpbench.core.tasks (the core layer); this alias stays for one release (0.2 removes it)."""

from dpbench.core.tasks import Batch, ClassificationTask, Forward, NegativeSamplingTask, Task, batch_size_of

__all__ = ["Batch", "ClassificationTask", "Forward", "NegativeSamplingTask", "Task", "batch_size_of"]
