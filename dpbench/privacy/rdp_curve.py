"""A mechanism known to dp-accounting's RDP accountant only by its Renyi curve.

dp-accounting's `RdpAccountant` composes the events it knows (Gaussian, Poisson-sampled Gaussian, RepeatAndSelect,
...) and refuses others. The random-sensitivity steps of JL and D2P2 have no event there, but dpbench bounds their
Renyi DP at the accountant's orders (`SubsampledGaussianMixture.truncated_rdp`); `RdpCurveDpEvent` carries that bound
and `CurveRdpAccountant` composes it like any other event, so RepeatAndSelect (Papernot & Steinke) applies to them
unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import attr
import numpy as np
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant


@attr.s(frozen=True, slots=True, auto_attribs=True)
class RdpCurveDpEvent(dp_event.DpEvent):
    """One application of a mechanism whose RDP at `orders` is at most `rdp` (both directions of adjacency)."""

    orders: tuple[float, ...]
    rdp: tuple[float, ...]


class CurveRdpAccountant(RdpAccountant):
    """dp-accounting's RDP accountant that also composes `RdpCurveDpEvent`s given at its own orders. It extends
    `_maybe_compose` and adds to `_rdp` as the accountant's own events do (dp-accounting 0.6; the pin keeps it below
    1.0, and tests/privacy/test_private_tuning.py checks the composition against Theorem 2 by hand)."""

    def _maybe_compose(self, event: dp_event.DpEvent, count: int, do_compose: bool):
        if not isinstance(event, RdpCurveDpEvent):
            return super()._maybe_compose(event, count, do_compose)
        if tuple(event.orders) != tuple(np.asarray(self._orders).tolist()):
            return RdpAccountant.CompositionErrorDetails(
                invalid_event=event, error_message="an RdpCurveDpEvent must be given at the accountant's own orders")
        if do_compose:
            self._rdp = self._rdp + count * np.asarray(event.rdp, dtype=np.float64)
        return None


def curve_event(orders: Sequence[float], rdp: np.ndarray) -> RdpCurveDpEvent:
    """The event of a curve, refused where it is not an RDP bound: dp-accounting's conversion reads a NaN as an
    epsilon of 0."""
    values = np.asarray(rdp, dtype=np.float64)
    if values.shape != (len(orders),) or np.isnan(values).any() or (values < 0).any():
        raise ValueError(f"an RDP curve needs one non-negative value (or +inf) per order, got {values.tolist()}")
    return RdpCurveDpEvent(tuple(float(order) for order in orders), tuple(values.tolist()))
