"""An independent reference for the Poisson-subsampled Gaussian's Renyi DP, for checking the accountants by hand."""

import math

import numpy as np
from scipy import special


def sampled_gaussian_rdp(q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    """Mironov, Talwar & Zhang (2019): at integer a, exp((a - 1) RDP) = sum_k C(a, k) (1-q)^(a-k) q^k e^((k^2-k)/(2
    sigma^2))."""
    out = []
    for a in orders:
        k = np.arange(a + 1)
        log_terms = (special.gammaln(a + 1) - special.gammaln(k + 1) - special.gammaln(a - k + 1)
                     + (a - k) * math.log1p(-q) + k * math.log(q) + (k * k - k) / (2 * sigma**2))
        out.append(special.logsumexp(log_terms) / (a - 1))
    return np.array(out)
