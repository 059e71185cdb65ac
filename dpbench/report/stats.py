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


def interval95(values: list[float | None], within: tuple[float | None, float | None] = (None, None)
               ) -> tuple[float, float] | None:
    """Student-t 95% confidence interval of the mean, clipped to the range the quantity can take (`within`: an
    accuracy in [0, 1], a throughput or a memory above 0; a few seeds' t-interval runs past both); None under two
    finite values (no spread to estimate)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if len(finite) < 2:
        return None
    centre = mean(finite)
    half = float(student_t.ppf(0.5 + LEVEL / 2, len(finite) - 1)) * stdev(finite) / math.sqrt(len(finite))
    low, high = within
    return (centre - half if low is None else max(low, centre - half),
            centre + half if high is None else min(high, centre + half))
