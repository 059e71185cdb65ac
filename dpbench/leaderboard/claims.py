"""Each paper's headline claim checked against the measured table, one sentence each, with the numbers.

The thresholds are stated in the sentences: "close" accuracy is within 2 points; "far less memory" is at most
0.7x; "better" is a higher mean test accuracy (lower loss) over the seeds. Where the task names the accuracy of a
constant prediction (its `chance`), nothing is judged or crowned unless it beats that by a point: two methods that
both learned nothing are not "close".
"""

from __future__ import annotations

from dpbench.leaderboard.summary import Entry

CLOSE_POINTS = 2.0
LESS_MEMORY = 0.7
ABOVE_CHANCE = 0.01


def fmt_value(value: float | None, metric: str | None) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}%" if metric == "accuracy" else f"{value:.3f}"


def margin(a: float, b: float, metric: str | None) -> str:
    """a - b in accuracy points, or in loss."""
    return f"{100 * (a - b):+.1f} points" if metric == "accuracy" else f"{a - b:+.3f}"


def is_better(a: float, b: float, metric: str | None) -> bool:
    return a < b if metric == "loss" else a > b


def _find(entries: list[Entry], method: str, epsilon: float | None) -> Entry | None:
    for entry in entries:
        if entry.method == method and entry.epsilon == epsilon and entry.mean is not None:
            return entry
    return None


def learned(entry: Entry, chance: float | None) -> bool:
    """Whether the entry's mean beats a constant prediction (always true where the task names no chance level)."""
    return chance is None or entry.mean is None or entry.metric != "accuracy" or entry.mean > chance + ABOVE_CHANCE


def _at_chance(claim: str, task: str, compared: list[Entry], chance: float) -> str:
    means = ", ".join(f"{e.label} {fmt_value(e.mean, 'accuracy')}" for e in compared)
    return (f"{claim}, {task}: cannot be judged here, no method compared beats a constant prediction's "
            f"{fmt_value(chance, 'accuracy')} ({means}).")


def _verdict(holds: bool) -> str:
    return "holds here" if holds else "**does not hold here**"


def winners(entries: list[Entry], budgets: tuple[float, ...], chance: float | None = None) -> list[str]:
    """Per budget: the best private method and its margin over the best vanilla DP-SGD / DP-Adam."""
    lines = []
    for epsilon in budgets:
        measured = [e for e in entries if e.epsilon == epsilon and e.mean is not None]
        if not measured:
            continue
        metric = measured[0].metric
        best = measured[0]
        for entry in measured[1:]:
            if is_better(entry.mean, best.mean, metric):
                best = entry
        if not learned(best, chance):
            lines.append(f"epsilon {epsilon:g}: none, no private method beats a constant prediction "
                         f"({fmt_value(chance, 'accuracy')}; best {best.label} {fmt_value(best.mean, metric)})")
            continue
        vanilla = [e for e in measured if e.method in ("dpsgd", "dpadam")]
        against = ""
        if vanilla:
            base = vanilla[0]
            for entry in vanilla[1:]:
                if is_better(entry.mean, base.mean, metric):
                    base = entry
            against = (f", {margin(best.mean, base.mean, metric)} over {base.label} ({fmt_value(base.mean, metric)})"
                       if best is not base else " (vanilla itself)")
        lines.append(f"epsilon {epsilon:g}: **{best.label}** {fmt_value(best.mean, metric)}{against}")
    return lines


def _jl(task: str, entries: list[Entry], optimizer: str, epsilon: float, chance: float | None) -> str | None:
    """Every measured rung against vanilla with the same optimizer: the claim holds if one rung is close and faster."""
    rungs = [e for e in entries if e.method == "jl" and e.epsilon == epsilon]
    if not rungs:
        return None
    base = _find(entries, "dpsgd" if optimizer == "sgd" else "dpadam", epsilon)
    measured = [e for e in rungs if e.mean is not None]
    refused = [e.label for e in rungs if e.refused]
    if not measured:
        return (f"JL, {task}, epsilon {epsilon:g}: cannot be checked, every rung tried was refused "
                f"({', '.join(refused)}).")
    if base is None or base.cost("step_s") is None:
        return f"JL, {task}: no vanilla run with the same optimizer at epsilon {epsilon:g} to compare with."
    if not any(learned(e, chance) for e in [base, *measured]):
        return _at_chance(f"JL, epsilon {epsilon:g}", task, [base, *measured], chance)
    timed = [e for e in measured if e.cost("step_s") is not None]
    if not timed:
        return f"JL, {task}, epsilon {epsilon:g}: cannot be checked, no rung recorded its time per step."
    metric = base.metric
    parts, holds = [], False
    for jl in timed:
        ratio = jl.cost("step_s") / base.cost("step_s")
        close = abs(100 * (jl.mean - base.mean)) <= CLOSE_POINTS if metric == "accuracy" else not is_better(
            base.mean, jl.mean, metric)
        holds = holds or (close and ratio < 1)
        parts.append(f"{jl.label} {fmt_value(jl.mean, metric)} ({margin(jl.mean, base.mean, metric)}) at "
                     f"{ratio:.2f}x its time per step")
    untimed = [e.label for e in measured if e not in timed]
    note = (f" (smaller r refused: {', '.join(refused)})" if refused else "") + (
        f" (no timings: {', '.join(untimed)})" if untimed else "")
    return (f"JL (norms from r projections: accuracy close to DP-SGD at a fraction of the time), {task}, epsilon "
            f"{epsilon:g}, against {base.label} {fmt_value(base.mean, metric)}{note}: {'; '.join(parts)}: "
            f"{_verdict(holds)}.")


def _grape(task: str, entries: list[Entry], epsilon: float, chance: float | None) -> str | None:
    grape, base = _find(entries, "grape", epsilon), _find(entries, "dpadam", epsilon)
    if grape is None or base is None or not grape.peak_mb or not base.peak_mb:
        return None
    if not learned(base, chance) and not learned(grape, chance):
        return _at_chance(f"GRAPE, epsilon {epsilon:g}", task, [grape, base], chance)
    metric = grape.metric
    ratio = grape.cost("peak_mb") / base.cost("peak_mb")
    close = abs(100 * (grape.mean - base.mean)) <= CLOSE_POINTS
    return (f"GRAPE (DP-Adam accuracy with far less memory), {task}, epsilon {epsilon:g}: "
            f"{fmt_value(grape.mean, metric)} vs DP-Adam {fmt_value(base.mean, metric)} "
            f"({margin(grape.mean, base.mean, metric)}) at {ratio:.2f}x its peak memory "
            f"({grape.cost('peak_mb'):.0f} vs {base.cost('peak_mb'):.0f} MB): "
            f"{_verdict(close and ratio <= LESS_MEMORY)}.")


def _d2p2(task: str, entries: list[Entry], budgets: tuple[float, ...], chance: float | None) -> str | None:
    pairs = [(eps, _find(entries, "d2p2", eps), _find(entries, "dpsgd", eps)) for eps in budgets]
    pairs = [(eps, d, b) for eps, d, b in pairs if d is not None and b is not None]
    if not pairs:
        return None
    learning = [(eps, d, b) for eps, d, b in pairs if learned(b, chance) or learned(d, chance)]
    if not learning:
        return _at_chance("D2P2", task, [pairs[-1][1], pairs[-1][2]], chance)
    pairs = learning  # a budget where neither learned says nothing about "better"
    metric = pairs[0][1].metric
    parts = [f"epsilon {eps:g}: {fmt_value(d.mean, metric)} vs {fmt_value(b.mean, metric)} "
             f"({margin(d.mean, b.mean, metric)})" for eps, d, b in pairs]
    smallest = pairs[0]
    largest = pairs[-1]
    gap_small = smallest[1].mean - smallest[2].mean
    gap_large = largest[1].mean - largest[2].mean
    if metric == "loss":
        gap_small, gap_large = -gap_small, -gap_large
    holds = gap_small > 0 and gap_small >= gap_large
    return (f"D2P2 (better than DP-SGD, especially at small epsilon), {task}: D2P2-SGD vs DP-SGD at "
            f"{'; '.join(parts)}: {_verdict(holds)}.")


def _sparse(task: str, entries: list[Entry], epsilon: float, chance: float | None) -> str | None:
    sparse = _find(entries, "sparse", epsilon)
    base = _find(entries, "dpadam", epsilon) or _find(entries, "dpsgd", epsilon)
    if sparse is None or base is None:
        return None
    if not learned(base, chance) and not learned(sparse, chance):
        return _at_chance(f"sparse, epsilon {epsilon:g}", task, [sparse, base], chance)
    metric = sparse.metric
    return (f"sparse (lower word2vec loss than DP-SGD), {task}, epsilon {epsilon:g}: test {metric} "
            f"{fmt_value(sparse.mean, metric)} vs {base.label} {fmt_value(base.mean, metric)} "
            f"({margin(sparse.mean, base.mean, metric)}): {_verdict(is_better(sparse.mean, base.mean, metric))}.")


def check_claims(tasks: list[tuple[str, str, list[Entry], float | None]], budgets: tuple[float, ...],
                 reference: float) -> list[str]:
    """tasks: (title, task optimizer, entries, chance level or None). Sentences for every claim the table can check."""
    sentences = []
    for title, optimizer, entries, chance in tasks:
        found = [_jl(title, entries, optimizer, reference, chance), _grape(title, entries, reference, chance),
                 _d2p2(title, entries, budgets, chance), _sparse(title, entries, reference, chance)]
        sentences += [s for s in found if s]
    return sentences
