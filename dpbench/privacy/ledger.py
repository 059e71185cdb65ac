"""Record of the mechanisms a run has actually composed, step by step (merged into runs of repeats), checked against
what the privatizer declared: a ledger never reports less than the privatizer's own composition() for its steps."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from dpbench.privacy.accountant import EpsilonReport, PrivacyAccountant, merge_composition
from dpbench.privacy.mechanisms import Composition, Mechanism, mechanism_from_dict

log = logging.getLogger(__name__)
RDP_RELATIVE_TOLERANCE = 1e-9
"""Where the declared figure is an RDP bound (PRV failed), it has no error bar: RDP against RDP, up to round-off."""


@dataclass(frozen=True)
class Underreport:
    """The ledger's epsilon is certainly below the declared composition's for the same steps; the run reports the
    declared figure (results.json: `ledger_underreported`)."""

    ledger_epsilon: float
    composition_epsilon: float
    steps: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _slice(composition: Composition, start: int, end: int) -> Composition:
    """Steps [start, end) of a composition that lists one mechanism per step in step order."""
    sliced, first = [], 0
    for mechanism, count in composition:
        taken = min(first + count, end) - max(first, start)
        if taken > 0:
            sliced.append((mechanism, taken))
        first += count
    return sliced


class DeclaredComposition:
    """What a privatizer's composition() declares for the steps a run has taken, under the plans it has had.

    Steps [first, end) taken under a plan of T steps are steps [first, end) of composition(sigma, T) when that lists
    one mechanism per step in step order: a schedule may depend on the run's length (D2P2's), so 100 steps of a
    1,000-step plan are not a 100-step plan (stop_on_budget, an epsilon() call mid-run), and an extended run
    (extend_run) took its first steps under the shorter plan. Otherwise, and past a plan (a longer Trainer at a fixed
    noise), it is composition(sigma, steps). A class, not a closure: strategies pickle.
    """

    def __init__(self, composition: Callable[[float, int], Composition], noise_multiplier: float,
                 planned_steps: int, name: str):
        """`name` names the privatizer in the warning."""
        self.composition = composition
        self.noise_multiplier = noise_multiplier
        self.planned_steps = planned_steps
        self.name = name

    def __call__(self, steps: int, plans: list[tuple[int, int]]) -> Composition:
        """`plans`: (first step, planned steps) of each plan of the run, in order."""
        ends = [first for first, _ in plans[1:]] + [steps]
        declared: Composition = []
        for (first, planned), end in zip(plans, ends, strict=True):
            composition = self.composition(self.noise_multiplier, planned)
            if end > planned or sum(count for _, count in composition) != planned:
                return self.composition(self.noise_multiplier, steps)
            declared += _slice(composition, first, end)
        return declared


def _contains(ledger: Composition, declared: Composition) -> bool:
    """Whether the ledger composes every declared release (and maybe more): then it cannot spend less."""
    return Counter(dict(merge_composition(declared))) <= Counter(dict(merge_composition(ledger)))


class PrivacyLedger:
    """Append-only list of (mechanism, consecutive steps); saved in checkpoints so resumed runs account exactly.

    With `declared`, every epsilon() is checked against the declared composition of the steps taken (the
    privatizer's contract: step_mechanisms() and composition() describe the same releases); a ledger certainly
    below it is reported at the declared figure, with a warning and `underreported` set.
    """

    def __init__(self, delta: float, accountant: PrivacyAccountant | None = None,
                 declared: DeclaredComposition | None = None):
        self.delta = delta
        self.accountant = accountant or PrivacyAccountant()
        self.declared = declared
        self.entries: list[tuple[Mechanism, int]] = []
        self.steps = 0
        """Logical steps recorded (a step may compose several mechanisms)."""
        self.epsilon_history: list[tuple[int, float]] = []
        """(steps, epsilon spent) at each epoch end: what the run had spent when."""
        self.underreported: Underreport | None = None
        """Set by epsilon(): the ledger's own figure was below the declared composition's for its steps."""
        self.plans: list[tuple[int, int]] = [] if declared is None else [(0, declared.planned_steps)]
        """(first step, planned steps) of each plan the steps were taken under (extend_run adds one)."""
        self._report: tuple[tuple, EpsilonReport] | None = None

    def record(self, mechanisms: list[Mechanism]) -> None:
        """One logical step; a step may compose several mechanisms (e.g. selection and noise)."""
        self.steps += 1
        for mechanism in mechanisms:
            if self.entries and self.entries[-1][0] == mechanism:
                self.entries[-1] = (mechanism, self.entries[-1][1] + 1)
            else:
                self.entries.append((mechanism, 1))

    def composition(self) -> Composition:
        return list(self.entries)

    def epsilon(self, accountant: PrivacyAccountant | None = None) -> EpsilonReport:
        """The composed epsilon (never below the declared composition's), kept until the ledger changes: the last
        epoch's log and the run's summary both ask. `accountant`: another discretisation (the per-epoch log's coarser
        one), cross-checked the same way and not kept."""
        if accountant is not None:
            return self._crosscheck(accountant.epsilon(self.composition(), self.delta), accountant)[1]
        key = (self.delta, tuple(self.entries), tuple(self.plans))
        if self._report is None or self._report[0] != key:
            own = self.accountant.epsilon(self.composition(), self.delta)
            self.underreported, report = self._crosscheck(own, self.accountant)
            self._report = (key, report)
        return self._report[1]

    def _crosscheck(
        self, own: EpsilonReport, accountant: PrivacyAccountant
    ) -> tuple[Underreport | None, EpsilonReport]:
        """(the under-report, the figure to report). No accountant call when the ledger composes every declared
        release (every built-in privatizer); otherwise flagged only when the ledger's upper bound lies below the
        declared figure's lower bound, so that the PRV's discretisation error alone never flags a run."""
        if self.declared is None or self.steps == 0:
            return None, own
        declared = self.declared(self.steps, self.plans)
        if _contains(self.composition(), declared):
            return None, own
        figure = accountant.epsilon(declared, self.delta)
        if figure.epsilon_lower is not None:
            below = own.epsilon < figure.epsilon_lower
        else:
            own_rdp = own.epsilon if own.method == "rdp" else accountant.rdp_epsilon(self.composition(), self.delta)
            below = own_rdp < figure.epsilon * (1 - RDP_RELATIVE_TOLERANCE)
        if not below:
            return None, own
        log.warning(
            "privatizer %s under-reports: its ledger (step_mechanisms) composes epsilon %.4g over %d steps, below the "
            "%.4g of its declared composition() for them; reporting %.4g (results.json: ledger_underreported)",
            self.declared.name, own.epsilon, self.steps, figure.epsilon, figure.epsilon,
        )
        return Underreport(own.epsilon, figure.epsilon, self.steps), figure

    def state_dict(self) -> dict[str, Any]:
        return {
            "delta": self.delta,
            "entries": [(m.to_dict(), n) for m, n in self.entries],
            "steps": self.steps,
            "plans": list(self.plans),
            "epsilon_history": list(self.epsilon_history),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.delta = state["delta"]
        self.entries = [(mechanism_from_dict(m), n) for m, n in state["entries"]]
        self.steps = state.get("steps", sum(n for _, n in self.entries))
        self.epsilon_history = [tuple(item) for item in state.get("epsilon_history", [])]
        if self.declared is not None:  # steps past the checkpoint follow this run's plan (longer under extend_run)
            self.plans = [tuple(plan) for plan in state.get("plans", [])] or [(0, self.declared.planned_steps)]
            if self.plans[-1][1] != self.declared.planned_steps:
                self.plans.append((self.steps, self.declared.planned_steps))

    def to_json(self, strategy: str) -> dict[str, Any]:
        """Per-step record: each run of identical steps with its mechanism, and epsilon spent over time."""
        rows, start = [], 0
        for mechanism, count in self.entries:
            rows.append({"strategy": strategy, "first_step": start, "last_step": start + count - 1,
                         "mechanism": mechanism.to_dict()})
            start += count
        history = [{"steps": steps, "epsilon": epsilon} for steps, epsilon in self.epsilon_history]
        return {"delta": self.delta, "steps": self.steps, "mechanisms": rows, "epsilon_spent": history}
