"""Record of the mechanisms a run has actually composed, step by step (merged into runs of repeats)."""

from __future__ import annotations

from typing import Any

from dpbench.privacy.accountant import EpsilonReport, PrivacyAccountant
from dpbench.privacy.mechanisms import Composition, Mechanism, mechanism_from_dict


class PrivacyLedger:
    """Append-only list of (mechanism, consecutive steps); saved in checkpoints so resumed runs account exactly."""

    def __init__(self, delta: float, accountant: PrivacyAccountant | None = None):
        self.delta = delta
        self.accountant = accountant or PrivacyAccountant()
        self.entries: list[tuple[Mechanism, int]] = []
        self.epsilon_history: list[tuple[int, float]] = []
        """(steps, epsilon spent) at each epoch end: what the run had spent when."""
        self._report: tuple[tuple, EpsilonReport] | None = None

    @property
    def steps(self) -> int:
        return sum(count for _, count in self.entries)

    def record(self, mechanisms: list[Mechanism]) -> None:
        """One logical step; a step may compose several mechanisms (e.g. selection and noise)."""
        for mechanism in mechanisms:
            if self.entries and self.entries[-1][0] == mechanism:
                self.entries[-1] = (mechanism, self.entries[-1][1] + 1)
            else:
                self.entries.append((mechanism, 1))

    def composition(self) -> Composition:
        return list(self.entries)

    def epsilon(self) -> EpsilonReport:
        """The composed epsilon, kept until the ledger changes: the last epoch's log and the run's summary both ask."""
        key = (self.delta, tuple(self.entries))
        if self._report is None or self._report[0] != key:
            self._report = (key, self.accountant.epsilon(self.composition(), self.delta))
        return self._report[1]

    def state_dict(self) -> dict[str, Any]:
        return {
            "delta": self.delta,
            "entries": [(m.to_dict(), n) for m, n in self.entries],
            "epsilon_history": list(self.epsilon_history),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.delta = state["delta"]
        self.entries = [(mechanism_from_dict(m), n) for m, n in state["entries"]]
        self.epsilon_history = [tuple(item) for item in state.get("epsilon_history", [])]

    def to_json(self, strategy: str) -> dict[str, Any]:
        """Per-step record: each run of identical steps with its mechanism, and epsilon spent over time."""
        rows, start = [], 0
        for mechanism, count in self.entries:
            rows.append({"strategy": strategy, "first_step": start, "last_step": start + count - 1,
                         "mechanism": mechanism.to_dict()})
            start += count
        history = [{"steps": steps, "epsilon": epsilon} for steps, epsilon in self.epsilon_history]
        return {"delta": self.delta, "steps": self.steps, "mechanisms": rows, "epsilon_spent": history}
