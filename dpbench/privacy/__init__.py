"""Privacy accounting (prv-accountant with an RDP fallback), calibration and Poisson sampling."""

from dpbench.privacy.accountant import EpsilonReport, PrivacyAccountant
from dpbench.privacy.calibration import calibrate_noise_multiplier
from dpbench.privacy.ledger import PrivacyLedger
from dpbench.privacy.mechanisms import Composition, Mechanism, SubsampledGaussian

__all__ = [
    "Composition",
    "EpsilonReport",
    "Mechanism",
    "PrivacyAccountant",
    "PrivacyLedger",
    "SubsampledGaussian",
    "calibrate_noise_multiplier",
]
