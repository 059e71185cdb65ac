"""Each paper's headline claim checked against the measured table, one sentence each, with the numbers.

Every comparison is paired over seeds against the paper's baseline at that budget: the vanilla method with the
claimed method's optimizer (compare.paper_baseline; the best vanilla method, said so, where the task runs no such
baseline). Each verdict is one of "holds", "does not hold" or "not distinguishable at this budget", decided by the
judge the report passes: over the whole family of the report's claims, Holm-corrected (family.py). "Close" accuracy
is a non-inferiority margin of 2 points (the difference's test against -2 points); a loss has no margin, so its
"close" is tested as "better". These tables judge utility only: a method's memory and time are shown beside its
verdict but judged in the "Claims at scale" section (scale.py), at the paper's scale and against the paper's
baseline, never on a small model's CPU peaks. Where the task names what a constant prediction scores (its
`chance`: the majority class's accuracy, or a loss task's best constant-score loss), nothing is judged or crowned
unless it beats that (an accuracy by a point): two methods that both learned nothing are not "close", nor is one of
them "better". Each sentence names the task's scale (its title) and the device the runs used.
"""

from __future__ import annotations

from dpbench.leaderboard.compare import (
    FAILS,
    HOLDS,
    STAND_IN,
    UNCLEAR,
    best_baseline,
    best_of,
    chosen_on_selection,
    paper_baseline,
)
from dpbench.leaderboard.family import Judge, Test, better_test, close_test
from dpbench.leaderboard.summary import ABOVE_CHANCE, Entry

CLOSE_POINTS = 2.0
LESS_MEMORY = 0.7


def fmt_value(value: float | None, metric: str | None) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}%" if metric == "accuracy" else f"{value:.3f}"


def fmt_number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def fmt_ratio(value: float | None, base: float | None) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}x"


def fmt_entry(entry: Entry) -> str:
    """'92.6% [91.9, 93.3]': the mean and its 95% interval over seeds."""
    text = fmt_value(entry.mean, entry.metric)
    if entry.interval is None:
        return text
    low, high = entry.interval
    if entry.metric == "accuracy":
        return f"{text} [{100 * low:.1f}, {100 * high:.1f}]"
    return f"{text} [{low:.3f}, {high:.3f}]"


def _shown(entry: Entry, chance: float | None) -> str:
    """fmt_entry with the seeds that diverged (summary.DIVERGENCE_RULE): a verdict on a method that diverged says
    so beside its mean."""
    diverged = entry.diverged(chance)
    return fmt_entry(entry) + (f" ({len(diverged)}/{entry.finished} diverged)" if diverged else "")


def _find(entries: list[Entry], family: str, epsilon: float | None) -> Entry | None:
    """The method named `family` where the task runs it, else another method of its privatizer (a paper's setting)."""
    for entry in sorted(entries, key=lambda e: e.method != family):
        if entry.family == family and entry.epsilon == epsilon and entry.mean is not None:
            return entry
    return None


def learned(entry: Entry, chance: float | None) -> bool:
    """Whether the entry's mean beats a constant prediction: an accuracy by ABOVE_CHANCE, a loss by being below it
    (always true where the task names no chance level)."""
    if chance is None or entry.mean is None:
        return True
    if entry.metric == "loss":
        return entry.mean < chance
    return entry.metric != "accuracy" or entry.mean > chance + ABOVE_CHANCE


def _at_chance(claim: str, task: str, compared: list[Entry], chance: float) -> str:
    metric = compared[0].metric
    means = ", ".join(f"{e.label} {fmt_value(e.mean, e.metric)}" for e in compared)
    return (f"{claim}, {task}: cannot be judged here, no method compared beats a constant prediction's "
            f"{fmt_value(chance, metric)} ({means}).")


EDGE = " (tuned on its grid's edge)"
"""Beside a method whose search ended on the grid's edge at its limit: a comparison with it may understate it."""


def _edge(entry: Entry) -> str:
    """EDGE where the entry's point was chosen on the grid's edge, else ''."""
    return EDGE if entry.on_edge else ""


def named(entry: Entry) -> str:
    """The entry's label, with EDGE where its point was chosen on the grid's edge."""
    return entry.label + _edge(entry)


def _against(base: Entry, stand_in: str | None) -> str:
    """How a claim's sentence names its baseline: the paper's own, or the stand-in and why (compare.STAND_IN)."""
    return named(base) if stand_in is None else f"{named(base)} ({STAND_IN[stand_in]})"


def _verdict(verdict: str) -> str:
    return f"**{verdict}**" if verdict == FAILS else verdict


def _tolerance(metric: str | None) -> float:
    return CLOSE_POINTS / 100 if metric == "accuracy" else 0.0


def _compared(test: Test | None, judge: Judge | None) -> str:
    """'+1.2 points [-0.3, +2.7] over 3 paired seeds, p 0.04, Holm 0.31', or that they share no seed; without a
    judge (a claim decided by its costs alone, not tested) the comparison without p-values."""
    if test is None:
        return "no common seed"
    return test.comparison.text() + (judge.evidence(test) if judge is not None else "")


def winners(entries: list[Entry], budgets: tuple[float, ...], chance: float | None, judge: Judge) -> list[str]:
    """Per budget: the best private method, chosen on its selection runs (compare.best_of), and its paired margin
    over the best vanilla baseline."""
    lines = []
    for epsilon in budgets:
        measured = [e for e in entries if e.epsilon == epsilon and e.mean is not None]
        if not measured:
            continue
        best = best_of(measured)
        if not learned(best, chance):
            lines.append(f"epsilon {epsilon:g}: none, no private method beats a constant prediction "
                         f"({fmt_value(chance, best.metric)}; best {best.label} {fmt_value(best.mean, best.metric)})")
            continue
        basis = "" if chosen_on_selection(measured) else " (chosen on the evaluation seeds: no selection score)"
        base = best_baseline(entries, epsilon)
        against = ""
        if base is best:
            against = " (vanilla itself)"
        elif base is not None:
            test = better_test(best, base)
            against = (f", {_compared(test, judge)} over {named(base)} ({_shown(base, chance)}): better: "
                       f"{_verdict(judge.verdict(test))}" if test else f"; no seed in common with {base.label}")
        lines.append(f"epsilon {epsilon:g}: **{best.label}**{_edge(best)} {_shown(best, chance)}{basis}"
                     f"{against}")
    return lines


def _jl(task: str, entries: list[Entry], epsilon: float, chance: float | None, judge: Judge) -> str | None:
    """Every measured rung against the paper's baseline (exact norms with JL's optimizer: DP-SGD on an SGD task):
    each rung's verdict is its own, and the sentence names the rungs that hold (the claim's time half is judged at
    scale, where the rung measured is named too)."""
    rungs = [e for e in entries if e.family == "jl" and e.epsilon == epsilon]
    if not rungs:
        return None
    measured = [e for e in rungs if e.mean is not None]
    base, stand_in = paper_baseline(entries, measured[0]) if measured else (None, None)
    refused = [e.label for e in rungs if e.refused]
    if not measured:
        return (f"JL, {task}, epsilon {epsilon:g}: cannot be checked, every rung tried was refused "
                f"({', '.join(refused)}).")
    if base is None or base.cost("step_s") is None:
        return f"JL, {task}: no vanilla run at epsilon {epsilon:g} to compare with."
    if not any(learned(e, chance) for e in [base, *measured]):
        return _at_chance(f"JL, epsilon {epsilon:g}", task, [base, *measured], chance)
    timed = [e for e in measured if e.cost("step_s") is not None]
    if not timed:
        return f"JL, {task}, epsilon {epsilon:g}: cannot be checked, no rung recorded its time per step."
    parts, verdicts = [], []
    for jl in timed:
        ratio = jl.cost("step_s") / base.cost("step_s")
        test = close_test(jl, base, _tolerance(base.metric))
        verdicts.append(judge.verdict(test))
        parts.append(f"{named(jl)} {_shown(jl, chance)} ({_compared(test, judge)}) at {ratio:.2f}x its time per step")
    verdict = HOLDS if HOLDS in verdicts else UNCLEAR if UNCLEAR in verdicts else FAILS
    holding = [jl.label for jl, v in zip(timed, verdicts, strict=True) if v == HOLDS]
    untimed = [e.label for e in measured if e not in timed]
    note = (f" (smaller r refused: {', '.join(refused)})" if refused else "") + (
        f" (no timings: {', '.join(untimed)})" if untimed else "")
    where = f" for {', '.join(holding)} only" if holding and len(holding) < len(timed) else ""
    return (f"JL (norms from r projections: accuracy close to exact clipping; its time is judged in Claims at "
            f"scale), {task}, epsilon {epsilon:g}, against {_against(base, stand_in)} {_shown(base, chance)}{note}: "
            f"{'; '.join(parts)}: {_verdict(verdict)}{where}.")


def _grape(task: str, entries: list[Entry], epsilon: float, chance: float | None, judge: Judge) -> str | None:
    grape = _find(entries, "grape", epsilon)
    if grape is None:
        return None
    base, stand_in = paper_baseline(entries, grape)
    if base is None or not grape.peak_mb or not base.peak_mb:
        return None
    if not learned(base, chance) and not learned(grape, chance):
        return _at_chance(f"GRAPE, epsilon {epsilon:g}", task, [grape, base], chance)
    test = close_test(grape, base, _tolerance(base.metric))
    ratio = grape.cost("peak_mb") / base.cost("peak_mb")
    return (f"GRAPE (DP-Adam accuracy; memory and speed are judged in Claims at scale), {task}, epsilon {epsilon:g}: "
            f"{_shown(grape, chance)}{_edge(grape)} vs {_against(base, stand_in)} {_shown(base, chance)} "
            f"({_compared(test, judge)}) at "
            f"{ratio:.2f}x its peak memory ({grape.cost('peak_mb'):.0f} vs {base.cost('peak_mb'):.0f} MB): "
            f"{_verdict(judge.verdict(test))}.")


def _d2p2(task: str, entries: list[Entry], budgets: tuple[float, ...], chance: float | None,
          judge: Judge) -> str | None:
    """Judged at every budget where something learned, each budget's verdict stated ("especially at small epsilon"
    is read from them, not summarised into one)."""
    found = [(eps, _find(entries, "d2p2", eps)) for eps in budgets]
    pairs = [(eps, d, *paper_baseline(entries, d)) for eps, d in found if d is not None]
    pairs = [(eps, d, b, stand_in) for eps, d, b, stand_in in pairs if b is not None]
    if not pairs:
        return None
    learning = [(eps, d, b, stand_in) for eps, d, b, stand_in in pairs if learned(b, chance) or learned(d, chance)]
    if not learning:
        return _at_chance("D2P2", task, [pairs[-1][1], pairs[-1][2]], chance)
    parts, verdicts = [], []
    for eps, d2p2, base, stand_in in learning:
        test = better_test(d2p2, base)
        verdict = judge.verdict(test)
        verdicts.append(f"{_verdict(verdict).replace(' at this budget', '')} at epsilon {eps:g}")
        parts.append(f"epsilon {eps:g}: {_shown(d2p2, chance)}{_edge(d2p2)} vs {_against(base, stand_in)} "
                     f"{_shown(base, chance)} "
                     f"({_compared(test, judge)}, {verdict})")
    return (f"D2P2 (better than DP-SGD, especially at small epsilon), {task}: {pairs[0][1].label} at "
            f"{'; '.join(parts)}: {'; '.join(verdicts)}.")


def _sparse(task: str, entries: list[Entry], epsilon: float, chance: float | None, judge: Judge) -> str | None:
    sparse = _find(entries, "sparse", epsilon)
    if sparse is None:
        return None
    base, stand_in = paper_baseline(entries, sparse)
    if base is None:
        return None
    if not learned(base, chance) and not learned(sparse, chance):
        return _at_chance(f"sparse, epsilon {epsilon:g}", task, [sparse, base], chance)
    test = better_test(sparse, base)
    return (f"sparse (lower word2vec loss than dense DP training), {task}, epsilon {epsilon:g}: {named(sparse)}, "
            f"test {sparse.metric} {_shown(sparse, chance)} vs {_against(base, stand_in)} {_shown(base, chance)} "
            f"({_compared(test, judge)}): {_verdict(judge.verdict(test))}.")


def check_claims(tasks: list[tuple[str, list[Entry], float | None]], budgets: tuple[float, ...],
                 judge: Judge) -> list[str]:
    """tasks: (title with its scale, entries, chance level or None). Sentences for every claim the table can check,
    at every budget it ran: a claim judged at one budget only would leave the others' evidence out of the family."""
    sentences = []
    for title, entries, chance in tasks:
        devices = sorted({"CPU" if e.device == "cpu" else e.device for e in entries if e.device})
        where = f"{title}, on {' and '.join(devices)}" if devices else title
        found = [*(_jl(where, entries, epsilon, chance, judge) for epsilon in budgets),
                 *(_grape(where, entries, epsilon, chance, judge) for epsilon in budgets),
                 _d2p2(where, entries, budgets, chance, judge),
                 *(_sparse(where, entries, epsilon, chance, judge) for epsilon in budgets)]
        sentences += [s for s in found if s]
    return sentences
