"""The method a run is, named with its optimizer: `privatizer=vanilla` is DP-SGD under `optimizer=sgd` and DP-Adam
under `optimizer=adam`, so a privatizer's name alone hides half of the method. Every label a user reads (the run
summary, results.json's `method`, W&B names and tags, report legends) comes from `method_label`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OPTIMIZERS = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW"}


@dataclass(frozen=True)
class Method:
    pattern: str
    """The label with {opt} where the optimizer's name goes."""
    paper_optimizer: str | None = None
    """The optimizer of the method's paper, where the paper fixes one (None: it is defined for any)."""


METHODS = {
    "nonprivate": Method("non-private {opt}"),
    "vanilla": Method("DP-{opt}"),
    "jl": Method("DP-{opt}-JL"),
    "sparse": Method("sparse DP-{opt}"),
    "grape": Method("DP-GRAPE ({opt})", "adam"),
    "dp_galore": Method("DP-GaLore ({opt})", "adam"),
    "d2p2": Method("D2P2-{opt}", "sgd"),
    "d2p_sgd": Method("D2P-{opt}", "sgd"),
    "dp2_sgd": Method("DP2-{opt}", "sgd"),
}


def optimizer_label(optimizer: str | None) -> str:
    return OPTIMIZERS.get(str(optimizer).lower(), str(optimizer)) if optimizer else "?"


def off_paper(privatizer: str, optimizer: str | None) -> str | None:
    """The paper's optimizer, when the run uses another one; else None."""
    method = METHODS.get(privatizer)
    if method is None or method.paper_optimizer is None or optimizer is None:
        return None
    return method.paper_optimizer if str(optimizer).lower() != method.paper_optimizer else None


def method_label(privatizer: str, optimizer: str | None) -> str:
    """E.g. DP-SGD, DP-Adam, D2P2-SGD, DP-GRAPE (Adam); "D2P2-Adam (paper: SGD)" off the paper's optimizer; a
    plugin's privatizer as "name (SGD)"."""
    method = METHODS.get(privatizer)
    opt = optimizer_label(optimizer)
    if method is None:
        return f"{privatizer} ({opt})"
    label = method.pattern.format(opt=opt)
    paper = off_paper(privatizer, optimizer)
    return f"{label} (paper: {optimizer_label(paper)})" if paper else label


VARIANT_KEYS = {
    "projections": "r",
    "rank": "rank",
    "update_every": "F",
    "dim": "p",
    "noise_decay": "decay",
    "selection": "sel",
    "sparsity": "s",
}
"""Privatizer keys that tell variants of one method apart, with their short names in labels."""


def with_variant(label: str, privatizer: Mapping[str, Any]) -> str:
    """The label with the privatizer keys that make it a variant, e.g. "DP-SGD-JL (r=5)", "DP-GRAPE (Adam) (rank=32,
    F=100)": the run summary, results.json's `method`, W&B names and report legends."""
    parts = [f"{short}={privatizer[key]}" for key, short in VARIANT_KEYS.items() if privatizer.get(key) is not None]
    return f"{label} ({', '.join(parts)})" if parts else label


def with_precision(label: str, precision: str) -> str:
    """The label with "(bf16)" for a bf16-mixed run, so that the report puts fp32 and bf16 of a method side by side."""
    return f"{label} (bf16)" if precision == "bf16-mixed" else label


def with_privatizer(method: str, privatizer: str) -> str:
    """The label and the `privatizer=` that selects it, e.g. "DP-SGD (privatizer=vanilla)"; a plugin's label
    already starts with it."""
    return method if method.startswith(privatizer) else f"{method} (privatizer={privatizer})"


ENGINES = {"vanilla": "ghost norms", "materialized": "materialized per-sample gradients"}
"""The exact DP-SGD/DP-Adam engines the frontier compares (`privatizer=vanilla` and its `materialized` preset)."""
JL_PRESET = "jl_r"
"""`privatizer=jl_r5`: JL with 5 projections."""


def preset_label(preset: str, optimizer: str | None) -> str:
    """The label of a `privatizer=` preset, telling the two exact engines apart: "DP-Adam (ghost norms)"."""
    if preset in ENGINES:
        return f"{method_label('vanilla', optimizer)} ({ENGINES[preset]})"
    if preset.startswith(JL_PRESET):
        return f"{method_label('jl', optimizer)} (r={preset.removeprefix(JL_PRESET)})"
    return method_label(preset, optimizer)
