"""When an engine checks its per-sample gradients against per-example passes (verify.py): before its first step,
then again while training, within a fixed share of the training time.

A first-batch check misses what only training shows: a branch whose gradient is zero at first (a zero-initialised
gate, LoRA's B = 0, ReZero) hides the layers behind it until it opens. So the check comes back at a geometric sequence
of steps (the next after step s lies in [1.5 s, 2.5 s], drawn from the run's secret randomness, so a model cannot fit
the schedule) while the checks after the first stay within `time_fraction` of the training time so far, and at once
when a parameter whose gradient was zero over the whole checked batch first gets a non-zero one (each parameter's
first wake is checked whatever the budget: there are at most as many as parameters, and a gate that opens on a
misrouted layer must not run unchecked for hundreds of steps). The checked samples are secret draws too. The state is
checkpointed, so a resumed run knows what was checked and whether the engine was switched.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from dpbench.privacy.randomness import PrivacyRandomness

TIME_FRACTION = 0.02
CHECKED_SAMPLES = 3
CHECK_IN_STEPS = 4
"""A check's cost in steps until one after the first is measured (the first is a cold start: no estimate)."""


class CheckSchedule:
    """The steps and samples an engine checks, and what the checks found (for results.json)."""

    def __init__(self, randomness: PrivacyRandomness | None = None, time_fraction: float = TIME_FRACTION,
                 clock: Callable[[], float] = time.perf_counter):
        self.randomness = randomness if randomness is not None else PrivacyRandomness()
        self.time_fraction = time_fraction
        self.clock = clock
        self.step: int | None = None
        """The logical step under way (set by the strategy); None (an engine used directly): the first check only."""
        self.checked_steps: list[int] = []
        self.dormant: set[str] = set()
        """Parameters whose gradient was zero for every sample of the last checked batch."""
        self.switched: dict[str, Any] | None = None
        """engine=auto: where a check sent the run to the exact engine."""
        self.off: str | None = None
        """Why the engine's gradients are not checked against per-example passes (None: they are)."""
        self.engine: dict[str, str] | None = None
        """The per-sample engine serving the run now, and why (construction.py), for results.json."""
        self._next = 0
        self._woken: set[str] = set()
        self._woke_before: set[str] = set()
        self._checked_here = False
        """This process has checked: a resumed run checks before its first step as a new one does."""
        self._started: float | None = None
        self._steps_here = 0
        self._check_seconds = 0.0
        """Time of the checks after the first in this process: what the budget bounds."""
        self._first_seconds = 0.0
        self._recheck_cost: float | None = None

    def begin_step(self, step: int) -> None:
        if self._started is None:
            self._started = self.clock()
        elif step != self.step:
            self._steps_here += 1
        self.step = step

    @property
    def training_seconds(self) -> float:
        if self._started is None:
            return 0.0
        return self.clock() - self._started - self._check_seconds - self._first_seconds

    def _cost(self) -> float:
        if self._recheck_cost is not None:
            return self._recheck_cost
        return CHECK_IN_STEPS * self.training_seconds / self._steps_here if self._steps_here else float("inf")

    def due(self) -> bool:
        """Check now: before this process's first step, at a parameter's first wake, else when the step is drawn or
        a dormant parameter woke and the checks' time stays within the budget."""
        if not self._checked_here:
            return True
        if self.step is None or self.step == self.checked_steps[-1]:
            return False
        if self._woken - self._woke_before:
            return True
        if not (self._woken or self.step >= self._next):
            return False
        return self._check_seconds + self._cost() <= self.time_fraction * self.training_seconds

    def samples(self, batch_size: int) -> list[int]:
        draws = self.randomness.draws("verify", 0 if self.step is None else self.step, 0)
        return sorted(int(i) for i in draws.permutation(batch_size)[:CHECKED_SAMPLES])

    def checked(self, seconds: float, dormant: set[str]) -> None:
        step = 0 if self.step is None else self.step
        if self._checked_here:
            self._check_seconds += seconds
            self._recheck_cost = seconds
        else:
            self._first_seconds = seconds
        self._checked_here = True
        self.checked_steps.append(step)
        self._woke_before |= self._woken
        self.dormant, self._woken = dormant, set()
        spread = float(self.randomness.draws("verify", step, 1).uniform(1)[0])
        self._next = step + max(1, round((step + 1) * (0.5 + spread)))

    def saw_gradients(self, names: set[str]) -> None:
        """Parameters with a non-zero per-sample gradient this step: a dormant one among them calls a check."""
        self._woken |= self.dormant & names

    def caveat(self) -> str | None:
        """What an engine switch means for the epsilon of the run (None: no switch)."""
        if self.switched is None:
            return None
        step = self.switched["step"]
        return (f"not a guarantee: steps before {step} were clipped with per-sample gradients that the check at step "
                f"{step} found wrong ({', '.join(self.switched['parameters'])}); from then on the exact "
                f"{self.switched['to']} engine")

    def report(self) -> dict[str, Any]:
        return {
            "checked_steps": self.checked_steps,
            "check_time_s": self._check_seconds,
            "last_check_time_s": self._recheck_cost,
            "time_fraction": self.time_fraction,
            "switched_engine": self.switched,
            "engine": self.engine,
            "unchecked_because": self.off,
        }

    def state_dict(self) -> dict[str, Any]:
        return {"checked_steps": list(self.checked_steps), "dormant": sorted(self.dormant), "next": self._next,
                "woke_before": sorted(self._woke_before), "switched": self.switched}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.checked_steps, self.dormant = list(state["checked_steps"]), set(state["dormant"])
        self._next, self._woke_before, self.switched = state["next"], set(state["woke_before"]), state["switched"]
