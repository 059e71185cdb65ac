"""Mean and 95% interval over the repeats (seeds) of one configuration: a verdict needs its spread, not one number."""

from __future__ import annotations

import math
from statistics import mean, stdev

from scipy.stats import t as student_t

LEVEL = 0.95


def mean_of(values: list[float | None]) -> float | None:
    """Mean of the recorded values; infinite if any is (an epsilon the accountant could not bound)."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return math.inf if any(math.isinf(v) for v in present) else mean(present)


def interval95(values: list[float | None]) -> tuple[float, float] | None:
    """Student-t 95% confidence interval of the mean; None under two finite values (no spread to estimate)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if len(finite) < 2:
        return None
    centre = mean(finite)
    half = float(student_t.ppf(0.5 + LEVEL / 2, len(finite) - 1)) * stdev(finite) / math.sqrt(len(finite))
    return centre - half, centre + half
