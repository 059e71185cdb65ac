"""Poisson subsampling of a dominating pair, P vs Q -> q P + (1 - q) Q vs Q (prv-accountant's "remove"
convention): the pieces that the subsampled PRVs (mixture.py, sparse_step_accounting.py) share."""

from __future__ import annotations

import math

import numpy as np
from scipy import special


def loss_threshold(q: float, t: np.ndarray) -> np.ndarray:
    """The unsampled loss S at which the subsampled loss log(1 - q + q e^S) equals t: log((e^t - (1 - q)) / q).

    -inf at or below log(1 - q); written to stay accurate there and finite for large t (e^t overflows past ~709)."""
    t = np.asarray(t, dtype=np.float64)
    if q >= 1.0:
        return t.copy()
    floor = math.log1p(-q)
    inside = (t > floor) & np.isfinite(t)
    safe = np.where(inside, t, floor + 1.0)
    threshold = safe + np.log(-np.expm1(floor - safe)) - math.log(q)
    return np.where(inside, threshold, np.where(t > floor, np.inf, -np.inf))


def log_subsampled_moment(q: float, order: int, log_unsampled: np.ndarray) -> np.ndarray:
    """log E_Q[((q P + (1 - q) Q) / Q)^n] at an integer order n, from log E_Q[(P / Q)^j] for j = 0..n (the last
    axis of `log_unsampled`): the binomial expansion of Mironov, Talwar and Zhang (2019)."""
    return log_subsampled_moments(q, np.array([order]), log_unsampled)[..., 0]


def log_subsampled_moments(q: float, orders: np.ndarray, log_unsampled: np.ndarray) -> np.ndarray:
    """`log_subsampled_moment` at several integer orders at once (a new last axis): `log_unsampled`'s last axis
    covers j = 0..max(orders)."""
    n = np.asarray(orders, dtype=np.int64)[:, None]
    j = np.arange(log_unsampled.shape[-1])[None, :]
    valid = j <= n
    kept = np.where(valid, n - j, 0)
    # q = 1 (or 0): the zero-probability terms are -inf, never 0 * -inf
    log_q = j * math.log(q) if q > 0 else np.where(j == 0, 0.0, -np.inf)
    log_keep = kept * math.log1p(-q) if q < 1 else np.where(kept == 0, 0.0, -np.inf)
    log_binomial = special.gammaln(n + 1) - special.gammaln(j + 1) - special.gammaln(kept + 1)
    terms = np.where(valid, log_unsampled[..., None, :] + log_binomial + log_keep + log_q, -np.inf)
    return log_sum_exp(terms, axis=-1)


def log_sum_exp(values: np.ndarray, axis: int, weights: np.ndarray | None = None) -> np.ndarray:
    """log sum(weights * exp(values)) along `axis` (-inf where every term is), as scipy.special.logsumexp for
    non-negative weights at a third to a fifth of its time: calibrating a D2P2 or JL run calls it thousands of times."""
    peak = np.max(values, axis=axis, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    shifted = np.exp(values - peak)
    if weights is not None:
        shifted *= weights
    with np.errstate(divide="ignore"):
        return np.log(np.sum(shifted, axis=axis)) + np.squeeze(peak, axis=axis)
