"""The family of claims a report makes, decided together: Holm's step-down correction at family-wise alpha 0.05.

A report that states fifteen verdicts from 95% intervals expects one of them wrong by chance alone. So the report
is written twice with the same code (judge_all): a first pass collects every paired test a verdict rests on (the
winners, the glance table and the papers' claims; the same comparison stated twice is one test), Holm's correction
is applied over all of them, and the second pass writes each verdict from the corrected decision. A claim "holds"
only when its test is rejected after correction with the difference on its side of the line, "does not hold" when
rejected on the other side, and is "not distinguishable at this budget" otherwise; a comparison over fewer than two
paired seeds has no test and is never distinguishable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from dpbench.core.wording import counted
from dpbench.leaderboard.compare import FAILS, HOLDS, UNCLEAR, Paired, paired
from dpbench.leaderboard.summary import Entry

ALPHA = 0.05
"""The family-wise error rate: the chance that any verdict of the report is a false "holds" or "does not hold"."""

Key = tuple[object, ...]


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order: the k-th smallest p is multiplied by (m - k + 1),
    and an adjusted value is never below the one before it in that order. A test is rejected at family-wise alpha
    exactly when its adjusted value is at most alpha."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [1.0] * len(p_values)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


@dataclass(frozen=True)
class Test:
    """One claim's paired test: is the method's difference from the baseline above `line`?"""

    key: Key
    comparison: Paired
    line: float

    @property
    def p_value(self) -> float | None:
        return self.comparison.p_value(self.line)


def better_test(method: Entry, baseline: Entry) -> Test | None:
    """"The method is better than the baseline" (None when they share no seed)."""
    comparison = paired(method, baseline)
    return None if comparison is None else Test(_key("better", method, baseline), comparison, 0.0)


def close_test(method: Entry, baseline: Entry, tolerance: float) -> Test | None:
    """"The method is no worse than the baseline by more than `tolerance`" (a non-inferiority margin)."""
    comparison = paired(method, baseline)
    return None if comparison is None else Test(_key("close", method, baseline), comparison, -tolerance)


def _key(kind: str, method: Entry, baseline: Entry) -> Key:
    return (kind, method.task, method.variant, method.epsilon, baseline.variant, baseline.epsilon)


class Judge(Protocol):
    def verdict(self, test: Test | None) -> str: ...

    def evidence(self, test: Test | None) -> str: ...


class Collecting:
    """The first pass: every test a verdict is asked of joins the family; the verdicts it returns are not used."""

    def __init__(self) -> None:
        self.tests: dict[Key, Test] = {}

    def verdict(self, test: Test | None) -> str:
        if test is not None and test.p_value is not None:
            self.tests.setdefault(test.key, test)
        return UNCLEAR

    def evidence(self, test: Test | None) -> str:
        return ""

    def corrected(self, alpha: float = ALPHA) -> Family:
        tests = list(self.tests.values())
        adjusted = holm([test.p_value for test in tests])
        return Family(tests, dict(zip([test.key for test in tests], adjusted, strict=True)), alpha)


class Family:
    """The second pass: each verdict from its test's Holm-adjusted p-value over the whole family."""

    def __init__(self, tests: list[Test], adjusted: dict[Key, float], alpha: float):
        self.tests, self.adjusted, self.alpha = tests, adjusted, alpha

    def _adjusted(self, test: Test) -> float:
        if test.key not in self.adjusted:
            raise KeyError(f"claim {test.key} was not collected into the family: build the report with judge_all")
        return self.adjusted[test.key]

    def verdict(self, test: Test | None) -> str:
        if test is None or test.p_value is None or self._adjusted(test) > self.alpha:
            return UNCLEAR
        return HOLDS if test.comparison.difference > test.line else FAILS

    def evidence(self, test: Test | None) -> str:
        """', p 0.012, Holm 0.036' for a tested claim ("better": a difference of 0), ', p 0.012 against -2.0 points,
        Holm 0.036' for a claim tested against another line (a non-inferiority margin), '' for an untested one: the
        same pair reads different p-values under different claims."""
        if test is None or test.p_value is None:
            return ""
        line = "" if test.line == 0.0 else f" against {test.comparison.amount(test.line)}"
        return f", p {_p(test.p_value)}{line}, Holm {_p(self._adjusted(test))}"

    @property
    def held(self) -> int:
        return sum(self.verdict(test) == HOLDS for test in self.tests)

    def describe(self) -> str:
        """The report's sentence on the correction: the family's size and what it decided."""
        rejected = sum(self.adjusted[test.key] <= self.alpha for test in self.tests)
        return (f"The report's verdicts form one family of {counted(len(self.tests), 'tested claim')} (every paired "
                f"comparison a verdict below rests on, counted once; a comparison over fewer than two paired seeds "
                f"has no test and is not distinguishable). Each claim's two-sided paired t test is corrected with "
                f"Holm's step-down method at family-wise alpha {self.alpha:g}: a verdict is \"holds\" or \"does not "
                f"hold\" only where its Holm-adjusted p-value is at most {self.alpha:g}. Rejected after the "
                f"correction: {rejected} of {len(self.tests)} ({self.held} of them holding). Each comparison shows "
                f"its unadjusted 95% interval, its p-value and its Holm-adjusted p-value.")


def _p(value: float) -> str:
    return "< 0.001" if value < 0.001 else f"{value:.3f}"


Written = TypeVar("Written")


def judge_all(write: Callable[[Judge], Written]) -> tuple[Written, Family]:
    """Run `write` once to collect the family, correct it, and run it again to write the verdicts."""
    collecting = Collecting()
    write(collecting)
    family = collecting.corrected()
    return write(family), family
