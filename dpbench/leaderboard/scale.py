"""The leaderboard's "claims at scale" section: GRAPE's memory claim where its paper makes it (100M+ parameters),
generated from frontier records committed under docs/leaderboard/frontier/NAME/ (written by `python -m
dpbench.capacity frontier ... --out docs/leaderboard/frontier/NAME`), each beside what the paper's text states; each
record's figure is drawn again from it, so that every figure has the current styles.
`python -m dpbench.leaderboard` writes it with the rest; `--scale-only` rewrites it alone.

On CPU a process's peak includes the interpreter (Python, torch), which no method can save, so the ratios compare
peaks above it; on CUDA the peak is max_memory_reserved. A verdict of "does not hold" is only given at the paper's
scale (REGIME_PARAMETERS and up); below it the sentence says the regime was not reached.
"""

from __future__ import annotations

import json
from pathlib import Path

from dpbench.app.frontier_plot import replot
from dpbench.core.methods import preset_label
from dpbench.leaderboard.claims import LESS_MEMORY

REGIME_PARAMETERS = 100_000_000
"""The GRAPE paper's smallest model with a memory figure is RoBERTa-large (355M); ViT-base (86M) is close."""
JL_NEAR_NONPRIVATE = 1.5
"""Bu et al.: JL's memory is "nearly the same as that of non-private training" (Table 3: its largest batch within 2x
of non-private SGD's): judged as a peak at most this times non-private's."""
SPARSE_NO_DEARER = 1.05
"""Sparse's premise, a step no dearer than DP-SGD's where most rows are untouched: its step time and peak at most this
times DP-SGD's (5% for the spread of repeated timings)."""
PAPER = {
    ("opt", "6.7b"): "Tables 4, 12 and 13: DP-Adam (and non-private Adam) out of memory at batch 1 on an 80 GB H100, "
                     "DP-GRAPE trains",
    ("roberta", "large"): "Section 5.2: at batch 40 DP-Adam uses 78.1 GB and DP-GRAPE 24.4 GB (0.31x) on an H100",
    ("lstm", None): "Bu et al. 2021, Table 2: DP-Adam-JL with a few projections many times faster than DP-Adam with "
                    "per-sample gradients (TF-Privacy) on a BiLSTM (IMDb, batch 256); Section 3.2: memory nearly that "
                    "of non-private training",
    ("word2vec", None): "Zhang, Mironov, Hejazinia, Section 6 (word2vec, vocabulary 1K): noise and updates on the "
                        "privately selected rows only; the paper reports utility, not cost",
}
SECTION_TITLE = "## Claims at scale"
PAPER_DEFAULT = "Figure 3: DP-GRAPE's peak memory well under DP-Adam's at every batch (values only in the plot)"


def _single_device(record: dict) -> dict[str, dict]:
    """The rows run on one device, by privatizer (sharded rows are compared on their own: `_sharded_comparisons`)."""
    return {row["privatizer"]: row for row in record["rows"] if row.get("devices", 1) == 1}


def _label(row: dict, optimizer: str) -> str:
    devices = row.get("devices", 1)
    return preset_label(row["privatizer"], optimizer) + (f" sharded over {devices} (FSDP2, per rank)"
                                                          if devices > 1 else "")


def _sharded_comparisons(record: dict, grape: dict, optimizer: str) -> list[str]:
    """DP-GRAPE on one device against each method sharded over N (its largest rank): whole peaks, interpreter
    included on CPU (a sharded trial's interpreter is not read apart), as what must fit one device."""
    found = []
    for row in record["rows"]:
        if row.get("devices", 1) == 1:
            continue
        label, batch = _label(row, optimizer), record["fixed_batch"]
        if grape.get("peak_at_fixed_mb") and row.get("peak_at_fixed_mb"):
            found.append(f"DP-GRAPE on one device against {label}: at batch {batch}, "
                         f"{grape['peak_at_fixed_mb']:,.0f} MB against {row['peak_at_fixed_mb']:,.0f} MB per rank "
                         f"({grape['peak_at_fixed_mb'] / row['peak_at_fixed_mb']:.2f}x; whole peaks"
                         f"{', interpreter included' if record['device'] == 'cpu' else ''}).")
        else:
            found.append(f"{label}: not measured at batch {batch} ({row.get('note') or 'does not fit'}).")
    return found


def _override(overrides: list[str], key: str) -> str | None:
    return next((o.split("=", 1)[1] for o in overrides if o.startswith(f"{key}=")), None)


def _parameters(rows: list[dict]) -> int | None:
    return next((t["parameters"] for row in rows for t in row["trials"] if t.get("parameters")), None)


def _saved_mb(row: dict, device: str) -> float | None:
    """The peak at the fixed batch, above the interpreter on CPU (its bytes in use where the peak is the working
    set, its resident size where the record is older)."""
    peak = row["peak_at_fixed_mb"]
    if peak is None or device != "cpu":
        return peak
    fixed = next((t for t in row["trials"] if t["batch_size"] == row["fixed_batch"] and t["fits"]), {})
    if fixed.get("working_set_mb") is not None:
        return peak - (fixed.get("interpreter_in_use_mb") or 0.0)
    return peak - (row["interpreter_rss_mb"] or 0.0)


def _batch(row: dict) -> str:
    if row.get("refused"):
        return "refused"
    if row["out_of_memory_at_1"]:
        return "OOM at 1"
    failed = any(not t["fits"] for t in row["trials"])
    return str(row["max_batch_size"]) if failed else f"{row['max_batch_size']} (none failed; the search's limit)"


def _mb(value: float | None) -> str:
    return f"{value:,.0f}" if value is not None else "-"


def grape_verdict(record: dict, parameters: int | None, optimizer: str) -> str:
    """One sentence: DP-GRAPE's memory at the fixed batch against both DP-Adam baselines, with the verdict."""
    rows = _single_device(record)
    names = {name: preset_label(name, optimizer) for name in rows}
    device, batch = record["device"], record["fixed_batch"]
    grape = _saved_mb(rows["grape"], device) if "grape" in rows else None
    if grape is None:
        return f"DP-GRAPE was not measured at batch {batch} here ({rows.get('grape', {}).get('note') or 'absent'})."
    above = " above the interpreter" if device == "cpu" else ""
    parts = []
    for name in ("materialized", "vanilla", "nonprivate"):
        other = _saved_mb(rows[name], device) if name in rows else None
        if other:
            parts.append(f"{grape / other:.2f}x {names[name]}'s {other:,.0f} MB")
        elif name in rows and rows[name].get("refused"):
            parts.append(f"{names[name]} refused")
        elif name in rows:
            parts.append(f"{names[name]} does not fit at batch {batch}")
    baseline = next((rows[n] for n in ("materialized", "vanilla") if n in rows), None)
    if baseline is None:
        return f"DP-GRAPE peaks at {grape:,.0f} MB{above} at batch {batch}; no DP-Adam row to compare with."
    reference = _saved_mb(baseline, device)
    if baseline.get("refused"):
        verdict = "not judged: the baseline refused the model"
    elif reference is None or grape / reference <= LESS_MEMORY:
        verdict = "holds here"
    elif parameters is not None and parameters < REGIME_PARAMETERS:
        verdict = f"not judged: {parameters / 1e6:.0f}M parameters is below the paper's regime"
    else:
        verdict = "**does not hold here**"
    return (f"DP-GRAPE's memory claim (at most {LESS_MEMORY}x the peak of {names[baseline['privatizer']]}, the "
            f"paper's baseline): at batch {batch}, DP-GRAPE peaks at "
            f"{grape:,.0f} MB{above}, " + ", ".join(parts) + f": {verdict}.")


def _time_ratio(row: dict, base: dict) -> float | None:
    """Step time over the base's at the fixed batch: their samples/s inverted."""
    rate, base_rate = row.get("samples_per_s_at_fixed"), base.get("samples_per_s_at_fixed")
    return base_rate / rate if rate and base_rate else None


def _judged(ratio: float | None, limit: float) -> str:
    return "not measured" if ratio is None else ("holds here" if ratio <= limit else "**does not hold here**")


def jl_verdicts(record: dict, optimizer: str) -> list[str]:
    """Per JL row: its step time against both exact DP baselines and its peak against non-private's."""
    rows = _single_device(record)
    device, batch = record["device"], record["fixed_batch"]
    materialized, vanilla, nonprivate = rows.get("materialized"), rows.get("vanilla"), rows.get("nonprivate")
    sentences = []
    for name, row in rows.items():
        if not name.startswith("jl"):
            continue
        label = preset_label(name, optimizer)
        mine = _saved_mb(row, device)
        if mine is None:
            sentences.append(f"{label} was not measured at batch {batch} ({row.get('note') or 'no trial fitted'}).")
            continue
        speed = _time_ratio(row, materialized) if materialized else None
        ghost = _time_ratio(row, vanilla) if vanilla else None
        plain = _saved_mb(nonprivate, device) if nonprivate else None
        memory = mine / plain if plain else None
        above = " above the interpreter" if device == "cpu" else ""
        sentences.append(
            f"{label}'s claims (faster than {preset_label('materialized', optimizer)}, the paper's baseline; memory "
            f"at most {JL_NEAR_NONPRIVATE}x non-private's): at batch {batch}, its step takes "
            + (f"{speed:.2f}x the materialized baseline's time" if speed else "an unmeasured share of the baseline's")
            + (f" and {ghost:.2f}x {preset_label('vanilla', optimizer)}'s" if ghost else "")
            + f"; it peaks at {mine:,.0f} MB{above}"
            + (f", {memory:.2f}x {preset_label('nonprivate', optimizer)}'s {plain:,.0f} MB" if memory else "")
            + f": speed {_judged(speed, 1.0)}, memory {_judged(memory, JL_NEAR_NONPRIVATE)}.")
    return sentences


def sparse_verdict(record: dict, optimizer: str) -> str:
    """Sparse's step time and peak against DP-SGD's (the vanilla row), at the fixed batch."""
    rows = _single_device(record)
    device, batch = record["device"], record["fixed_batch"]
    sparse, base = rows["sparse"], rows.get("vanilla")
    label, base_label = preset_label("sparse", optimizer), preset_label("vanilla", optimizer)
    mine, theirs = _saved_mb(sparse, device), (_saved_mb(base, device) if base else None)
    if mine is None or theirs is None:
        return f"{label} against {base_label} was not measured at batch {batch} (a row is missing or did not fit)."
    time = _time_ratio(sparse, base)
    memory = mine / theirs
    worst = max(memory, time) if time is not None else None
    above = " above the interpreter" if device == "cpu" else ""
    return (f"{label}'s premise (a step no dearer than {base_label}'s where most rows are untouched, within "
            f"{SPARSE_NO_DEARER}x): at batch {batch}, its step takes "
            + (f"{time:.2f}x {base_label}'s time" if time is not None else "an unmeasured time")
            + f" and it peaks at {mine:,.0f} MB{above}, {memory:.2f}x {base_label}'s {theirs:,.0f} MB: "
            + f"{_judged(worst, SPARSE_NO_DEARER)}.")


def verdicts(record: dict, parameters: int | None, optimizer: str) -> list[str]:
    """The claims a record can judge, by the methods it measured."""
    single = _single_device(record)
    privatizers = set(single)
    found = [grape_verdict(record, parameters, optimizer)] if "grape" in privatizers else []
    if "grape" in privatizers:
        found += _sharded_comparisons(record, single["grape"], optimizer)
    found += jl_verdicts(record, optimizer)
    if "sparse" in privatizers:
        found.append(sparse_verdict(record, optimizer))
    return found


def _record_lines(record: dict, name: str) -> list[str]:
    overrides = record["overrides"]
    family, size = _override(overrides, "model"), _override(overrides, "model.size")
    parameters = _parameters(record["rows"])
    frozen = _override(overrides, "model.freeze")
    optimizer = _override(overrides, "optimizer") or "sgd"  # the config's default
    vocabulary, tokens = _override(overrides, "model.vocab_size"), _override(overrides, "data.max_length")
    title = (f"{family or 'model'} {size or ''}".rstrip()
             + (f", vocabulary {int(vocabulary):,}" if vocabulary else "") + (f", frozen {frozen}" if frozen else ""))
    setting = (f"{parameters / 1e6:,.1f}M parameters, " if parameters else "") + (
        (f"{tokens} tokens, " if tokens else "") + f"{record['device_name']}, cap "
        f"{record['cap_mb'] / 1024:g} GiB, {record.get('steps_per_trial', '?')} steps per trial, "
        f"search {record['wall_s'] / 60:.0f} min" + (f", load average {record['load_average']:.1f} on "
                                                      f"{record['cpus']} CPUs at its end (samples/s are only "
                                                      "comparable within a record)" if "load_average" in record
                                                      else ""))
    batch = record["fixed_batch"]
    lines = [f"### {title}", "", f"`{name}`: {setting}. Paper: {PAPER.get((family, size), PAPER_DEFAULT)}.", "",
             f"| method | largest batch | peak at {batch} (MB) | samples/s at {batch} | peak at largest (MB) | note |",
             "|---|---|---|---|---|---|"]
    for row in record["rows"]:
        rate = row["samples_per_s_at_fixed"]
        lines.append(f"| {_label(row, optimizer)} | {_batch(row)} "
                     f"| {_mb(row['peak_at_fixed_mb'])} | {f'{rate:.2f}' if rate else '-'} "
                     f"| {_mb(row['peak_at_max_mb'])} | {row['note'][:160]} |")
    lines += ["", *(f"- {sentence}" for sentence in verdicts(record, parameters, optimizer)), "",
              f"![{name}](leaderboard/frontier/{name}/frontier.png)", ""]
    return lines


def scale_section(frontier_dir: Path) -> list[str]:
    records = sorted(Path(frontier_dir).glob("*/frontier.json"))
    if not records:
        return []
    lines = [SECTION_TITLE, "",
             "Peak memory and speed of each method on published model shapes (random weights, built from config), "
             "from `python -m dpbench.capacity frontier`: every trial a fresh process under the cap, the largest batch "
             "found by doubling from the fixed batch. CPU peaks are the trial process's working set (malloc's bytes "
             "in use at their peak; records before 2026-11-29: its VmHWM), the interpreter included in the table and "
             "left out of the ratios; CUDA peaks are max_memory_reserved. Each figure is one measurement, not "
             "replicated over seeds, and its verdict (a ratio past the paper's threshold or not) is descriptive: it "
             "is outside the family of tested claims that the Holm correction covers.", ""]
    for path in records:
        replot(path)
        lines += _record_lines(json.loads(path.read_text()), path.parent.name)
    return lines


def rewrite(docs: Path) -> Path:
    """Replace (or append) the section in docs/leaderboard.md, leaving the cells' tables as they are: the frontier
    records change without the suite being run again."""
    path = docs / "leaderboard.md"
    text = path.read_text()
    kept = text.split("\n" + SECTION_TITLE)[0].rstrip("\n")
    path.write_text(kept + "\n\n" + "\n".join(scale_section(docs / "leaderboard" / "frontier")))
    return path

