"""Every name a run accepts (models, data sets, privatizers, optimizers, experiments, sweeps), where it comes from
and its keys, composed as `python -m dpbench GROUP=NAME` composes it: what `python -m dpbench.components` prints and
what error hints name."""

from __future__ import annotations

import re
import textwrap
from dataclasses import asdict, dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from hydra._internal.hydra import Hydra
from hydra.types import RunMode
from omegaconf import OmegaConf

from dpbench.app.hydra_setup import registries
from dpbench.core.config import validated
from dpbench.core.optim import OptimizerConfig
from dpbench.core.registry import COMPONENTS, RECIPES, TARGET, Registry, options

WIDTH = 110


@dataclass(frozen=True)
class Entry:
    name: str
    origin: str
    """built-in, a plugin's distribution, a preset over another name, a `_target_`, or why it cannot be listed."""
    keys: dict[str, Any]


def _value(value: Any) -> str:
    """A value as it is typed in an override."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return "[" + ",".join(map(_value, value)) + "]"
    text = str(value)
    return f"'{text}'" if not text or any(c in text for c in " ,=[]{}()'\"") else text


def _origin(registry: Registry | None, node: dict[str, Any], option: str, changed: dict[str, Any]) -> str:
    if TARGET in node:
        return f"{TARGET}: {node[TARGET]}"
    name = node.get("name", option)
    if name != option:
        settings = " ".join(f"{key}={_value(value)}" for key, value in changed.items())
        return f"preset of {name}" + (f": {settings}" if settings else "")
    if registry is None:
        return "built-in"
    points = entry_points(group=registry.entry_point_group, name=name)
    distributions = sorted({point.dist.name for point in points if point.dist is not None})
    if not distributions or distributions == ["dpbench"]:
        return "built-in"
    return f"plugin ({', '.join(distributions)})"


def _dotted(keys: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested nodes (model.lora) as the dotted keys an override types: lora.rank=8."""
    flat: dict[str, Any] = {}
    for key, value in keys.items():
        if isinstance(value, dict):
            flat.update(_dotted(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def component_entry(hydra: Hydra, group: str, option: str) -> Entry:
    """The node `group=option` composes to, merged into its component's dataclass."""
    cfg = hydra.compose_config("config", overrides=[f"{group}={option}", "hydra.mode=RUN"], run_mode=RunMode.RUN)
    node = options(cfg[group])
    registry = _registry(group)
    if registry is None:
        schema, settings = OptimizerConfig, node
    else:
        found, settings = registry.resolve(node)
        schema = found.schema
    keys = _dotted(asdict(validated(schema, settings, group)))
    base = _dotted(OmegaConf.to_container(OmegaConf.structured(schema)))
    changed = {key: value for key, value in keys.items() if key != "name" and base.get(key) != value}
    return Entry(option, _origin(registry, node, option, changed), {k: v for k, v in keys.items() if k != "name"})


def recipe_entry(hydra: Hydra, group: str, option: str) -> Entry:
    """An experiment or sweep: its name and the first sentence of the comment that describes it."""
    found = hydra.config_loader.repository.load_config(f"{group}/{option}")
    path = Path(found.path.removeprefix("file://")) / group / f"{option}.yaml" if found else None
    lines = path.read_text().splitlines() if path and path.is_file() else []
    return Entry(option, _first_sentence(lines), {})


def _first_sentence(lines: list[str]) -> str:
    """The leading comment's prose up to its first full stop (the indented lines after it are example commands)."""
    prose = []
    for line in lines:
        if not line.startswith("#") or line.startswith("#  "):
            break
        if "@package" not in line:
            prose.append(line.lstrip("#").strip())
    text = " ".join(prose)
    return re.split(r"(?<=\.)\s+(?=[A-Z])", text)[0].removesuffix(":")


def _registry(group: str) -> Registry | None:
    return {registry.group: registry for registry in registries()}.get(group)


def entries(hydra: Hydra, group: str) -> list[Entry]:
    """Every option of the group, and the entry points that are none because they fail to import (with why)."""
    composable = set(hydra.config_loader.get_group_options(group))
    registry = _registry(group)
    found = []
    for option in sorted(composable | set(registry or ())):
        try:
            if option not in composable:  # dpbench.core.registry skipped it when making config group options: say why
                registry.component(option)
            found.append((component_entry if group in COMPONENTS else recipe_entry)(hydra, group, option))
        except Exception as error:  # a plugin that fails to import or compose: the other names are still listed
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            found.append(Entry(option, f"cannot be listed: {message}", {}))
    return found


def format_group(group: str, found: list[Entry]) -> str:
    usage = f"+{group}=NAME" if group in RECIPES else f"{group}=NAME, {group}.KEY=VALUE"
    lines = [f"{group}  ({usage})"]
    width = max((len(entry.name) for entry in found), default=0) + 4
    for entry in found:
        lines.append(textwrap.fill(entry.origin, WIDTH, initial_indent=f"  {entry.name:<{width - 2}}",
                                   subsequent_indent=" " * width, break_on_hyphens=False))
        if entry.keys:
            keys = " ".join(f"{key}={_value(value)}" for key, value in entry.keys.items())
            lines.append(textwrap.fill(keys, WIDTH, initial_indent=" " * width, subsequent_indent=" " * width,
                                       break_on_hyphens=False, break_long_words=False))
    return "\n".join(lines)
