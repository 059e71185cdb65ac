"""What a figure says in words: its title (the task and its scale) and short legend entries (the method, then only the
keys that vary across the figure's configurations, under short names)."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from dpbench.core.methods import VARIANT_KEYS
from dpbench.core.registry import COMPONENTS

SHORT = {"privacy.epsilon": "ε", "privacy.noise_multiplier": "σ", "batch_size": "B", "model.name": "model",
         "data.name": "data"}
IN_LABEL = {"privatizer.name", "optimizer.name", *(f"privatizer.{key}" for key in VARIANT_KEYS)}

Task = tuple[Any, Any, Any]


def value_text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def short_names(keys: list[str]) -> dict[str, str]:
    """'optimizer.lr' -> 'lr': the last part of each key, or the whole key where two keys share it."""
    tails = [key.rsplit(".", 1)[-1] for key in keys]
    return {key: SHORT.get(key) or (tail if tails.count(tail) == 1 else key)
            for key, tail in zip(keys, tails, strict=True)}


def _implied(key: str, entries: list[dict[str, Any]]) -> bool:
    """A component's key that is constant among the entries sharing the component's name (e.g. model.hidden_size
    when two models are compared): the name already tells them apart."""
    component = key.split(".")[0]
    if component not in COMPONENTS or key == f"{component}.name":
        return False
    by_name: dict[str, set[str]] = defaultdict(set)
    for entry in entries:
        by_name[repr(entry["config"].get(f"{component}.name"))].add(repr(entry["config"].get(key)))
    return all(len(values) < 2 for values in by_name.values())


def _varies(key: str, entries: list[dict[str, Any]]) -> bool:
    return len({repr(entry["config"].get(key)) for entry in entries}) > 1


def distinguishing_keys(entries: list[dict[str, Any]]) -> list[str]:
    """Config keys that tell these entries apart and that neither the method's label nor another key's name says."""
    keys = sorted({k for entry in entries for k in entry["axes"]})
    return [key for key in keys if key not in IN_LABEL and _varies(key, entries) and not _implied(key, entries)]


@dataclass(frozen=True)
class Legend:
    """The keys a figure's labels name. A non-private entry's privacy keys change nothing it trains: it names them
    apart, as unused, and only those that tell two non-private entries apart (its runs at two epsilons are two
    configurations, never one mean)."""

    keys: list[str]
    unused: frozenset[str]

    def label(self, entry: dict[str, Any], exclude: frozenset[str] = frozenset()) -> str:
        """'DP-SGD-JL (r=5), B=256, ε=3': the method with its variant keys, then each key not excluded."""
        config = entry["config"]
        variants = [f"{short}={value_text(config[f'privatizer.{key}'])}" for key, short in VARIANT_KEYS.items()
                    if config.get(f"privatizer.{key}") is not None and f"privatizer.{key}" not in exclude]
        head = f"{entry['method']} ({', '.join(variants)})" if variants else entry["method"]
        names = short_names(self.keys)
        used, unused = [head], []
        for key in self.keys:
            if key in exclude:
                continue
            part = f"{names[key]}={value_text(config.get(key))}"
            if entry["private"] or not key.startswith("privacy."):
                used.append(part)
            elif key in self.unused:
                unused.append(part)
        text = ", ".join(used)
        return f"{text} (unused: {', '.join(unused)})" if unused else text


def legend_of(entries: list[dict[str, Any]]) -> Legend:
    keys = distinguishing_keys(entries)
    nonprivate = [entry for entry in entries if not entry["private"]]
    return Legend(keys, frozenset(k for k in keys if k.startswith("privacy.") and _varies(k, nonprivate)))


def task_of(entry: dict[str, Any]) -> Task:
    """What a figure is about: the model (with its published size, if any) and the data set."""
    return entry["model"], entry.get("model_size"), entry["data"]


def _count(parameters: int) -> str:
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if parameters >= scale:
            return f"{parameters / scale:.3g}{suffix}"
    return str(parameters)


def task_title(task: Task, entries: list[dict[str, Any]]) -> str:
    """'cnn on mnist5k, 26K parameters' (the count where results.json records it)."""
    model, size, data = task
    title = f"{model}{f' ({size})' if size else ''} on {data}"
    counts = sorted({int(e["parameters"]) for e in entries if e.get("parameters")})
    if counts:
        title += f", {_count(counts[0])}{f'–{_count(counts[-1])}' if len(counts) > 1 else ''} parameters"
    return title


def task_slug(task: Task) -> str:
    """File-name part of a task's figures: 'cnn_mnist5k', 'opt-125m_sst2'."""
    model, size, data = task
    text = f"{model}{f'-{size}' if size else ''}_{data}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)
