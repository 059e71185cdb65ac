"""When an engine checks its per-sample gradients against per-example passes (verify.py): before its first step,
then again while training, within a fixed share of the training time.

A first-batch check misses what only training shows: a branch whose gradient is zero at first (a zero-initialised
gate, LoRA's B = 0, ReZero) hides the layers behind it until it opens. So the check comes back at a geometric sequence
of steps (the next after step s lies in [1.5 s, 2.5 s], drawn from the run's secret randomness, so a model cannot fit
the schedule), and at the first step after a parameter whose gradient was zero over the whole checked batch gets a
non-zero one. Either waits while the checks' time would exceed `time_fraction` of the training time so far. The
checked samples are secret draws too.
"""

from __future__ import annotations

import time
from typing import Any

from dpbench.privacy.randomness import PrivacyRandomness

TIME_FRACTION = 0.02
CHECKED_SAMPLES = 3


class CheckSchedule:
    """The steps and samples an engine checks, and what the checks found (for results.json)."""

    def __init__(self, randomness: PrivacyRandomness | None = None, time_fraction: float = TIME_FRACTION):
        self.randomness = randomness if randomness is not None else PrivacyRandomness()
        self.time_fraction = time_fraction
        self.step: int | None = None
        """The logical step under way (set by the strategy); None (an engine used directly): the first check only."""
        self.checked_steps: list[int] = []
        self.dormant: set[str] = set()
        """Parameters whose gradient was zero for every sample of the last checked batch."""
        self.switched: dict[str, Any] | None = None
        """engine=auto: where a check sent the run to the exact engine."""
        self._next: int | None = None
        self._woken = False
        self._started: float | None = None
        self._check_seconds = 0.0
        """Time of the checks after the first: what the budget bounds."""
        self._first_seconds = 0.0
        self._last_cost = 0.0

    def begin_step(self, step: int) -> None:
        if self._started is None:
            self._started = time.perf_counter()
        self.step = step

    @property
    def training_seconds(self) -> float:
        if self._started is None:
            return 0.0
        return time.perf_counter() - self._started - self._check_seconds - self._first_seconds

    def due(self) -> bool:
        """Check now: before the first step, else when the step is drawn or a dormant parameter woke, and the
        checks' time stays within the budget."""
        if not self.checked_steps:
            return True
        if self.step is None or self.step == self.checked_steps[-1]:
            return False
        if not (self._woken or self.step >= self._next):
            return False
        return self._check_seconds + self._last_cost <= self.time_fraction * self.training_seconds

    def samples(self, batch_size: int) -> list[int]:
        draws = self.randomness.draws("verify", 0 if self.step is None else self.step, 0)
        return sorted(int(i) for i in draws.permutation(batch_size)[:CHECKED_SAMPLES])

    def checked(self, seconds: float, dormant: set[str]) -> None:
        step = 0 if self.step is None else self.step
        if self.checked_steps:  # the first check comes with any run; the budget is for the ones after it
            self._check_seconds += seconds
        else:
            self._first_seconds = seconds
        self._last_cost = seconds
        self.checked_steps.append(step)
        self.dormant, self._woken = dormant, False
        spread = float(self.randomness.draws("verify", step, 1).uniform(1)[0])
        self._next = step + max(1, round((step + 1) * (0.5 + spread)))

    def saw_gradients(self, names: set[str]) -> None:
        """Parameters with a non-zero per-sample gradient this step: a dormant one among them calls a check."""
        if self.dormant & names:
            self._woken = True

    def report(self) -> dict[str, Any]:
        return {
            "checked_steps": self.checked_steps,
            "check_time_s": self._check_seconds,
            "time_fraction": self.time_fraction,
            "switched_engine": self.switched,
        }
