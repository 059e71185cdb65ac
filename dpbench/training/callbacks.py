"""Privacy progress: epsilon spent, logged at every epoch end, outside the profiler's measured window."""

from __future__ import annotations

import time

import lightning as L

from dpbench.privacy.accountant import PrivacyAccountant
from dpbench.privacy.ledger import PrivacyLedger
from dpbench.profiling.callback import unmeasured


class EpsilonLogger(L.Callback):
    """Logs the ledger's epsilon with a coarser (still upper-bounding) discretisation to keep epochs fast; the last
    epoch uses the ledger's own accountant, so the final figure matches the run's reported epsilon (the coarse
    bound can read above a calibrated target)."""

    def __init__(self, ledger: PrivacyLedger, eps_error: float = 0.05):
        self.ledger = ledger
        self.accountant = PrivacyAccountant(eps_error=eps_error)
        self.seconds = 0.0
        """Time spent accounting: the run's training time leaves it out (D2P2's twelve noise buckets of chi-square
        mixtures took 0.6 s an epoch here, more than its steps on the CNN)."""

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        last = 0 < trainer.max_steps <= trainer.global_step or 0 < trainer.max_epochs <= trainer.current_epoch + 1
        ledger = self.ledger
        started = time.perf_counter()
        with unmeasured(trainer):  # the accountant's scratch is no part of the method's memory
            report = ledger.epsilon() if last else ledger.epsilon(self.accountant)
        self.seconds += time.perf_counter() - started
        ledger.epsilon_history.append((ledger.steps, report.epsilon))
        pl_module.log("privacy/epsilon_spent", report.epsilon, prog_bar=True)
        pl_module.log("privacy/steps", float(ledger.steps))
