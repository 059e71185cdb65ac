"""Named components (privatizers, models, data sets), built-in or from the user's own package, one way in.

A component is a factory (a PrivatizerStrategy class, a model builder, a data loader) that declares the dataclass
its config node is validated against: the type of its `config` parameter (or, for a class, its `config` attribute
annotation). It is reached in one of two ways, both ending in the same factory:

- by name: `privatizer=vanilla` looks `vanilla` up among the Python entry points of group `dpbench.privatizers`
  (`dpbench.models`, `dpbench.data`). dpbench's own entries are declared there, in its pyproject.toml, exactly as
  an installed plugin declares its own;
- by `_target_`: a config node (a yaml file in the user's `--config-dir` or `hydra.searchpath`) whose `_target_`
  names the factory, `my_pkg.module.Factory` or `my_pkg.module:Factory`.

The rest of the node (without `_target_`) is merged into the declared dataclass, so a mistyped key is an error.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, is_dataclass
from functools import cached_property
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dpbench.core.config import validated
from dpbench.core.errors import ConfigurationError

TARGET = "_target_"
COMPONENTS = ("model", "data", "privatizer", "optimizer")
"""The config groups a run composes one component of each (`GROUP=NAME`, `GROUP.KEY=VALUE`)."""
RECIPES = ("experiment", "sweep")
"""Selected with `+GROUP=NAME`: they are not in the primary config's defaults list."""


@dataclass(frozen=True)
class Component:
    factory: Callable[..., Any]
    """The class or builder that makes the component from its validated config."""
    schema: type
    """The dataclass the config node is validated against."""


def locate(target: str | Callable[..., Any], group: str) -> Callable[..., Any]:
    """The object a `_target_` names: `package.module.Name` (Hydra's form) or `package.module:Name` (entry points)."""
    if callable(target):
        return target
    path = str(target)
    module_name, _, attribute = path.partition(":") if ":" in path else path.rpartition(".")
    try:
        found: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError, ValueError) as error:
        raise ConfigurationError(f"{group}.{TARGET}={path!r} cannot be imported ({error}); is its package installed "
                                 "or on PYTHONPATH?") from None
    if not callable(found):
        raise ConfigurationError(f"{group}.{TARGET}={path!r} is not a class or function")
    return found


def _annotation(owner: Any, name: str | None) -> Any:
    try:
        hints = typing.get_type_hints(owner)
    except Exception:  # an annotation that does not resolve is reported as undeclared below
        return None
    if name is not None:
        return hints.get(name)
    parameters = [p for p in inspect.signature(owner).parameters.values() if p.name not in ("self", "return")]
    return hints.get(parameters[0].name) if parameters else None


def declared_schema(factory: Callable[..., Any], group: str) -> type:
    """The dataclass a factory declares for its config: a class's `config` annotation (or its __init__'s `config`
    parameter), a function's first parameter."""
    if inspect.isclass(factory):
        schema = _annotation(factory, "config") or _annotation(factory.__init__, "config")
    else:
        schema = _annotation(factory, None)
    if not (inspect.isclass(schema) and is_dataclass(schema)):
        name = getattr(factory, "__qualname__", repr(factory))
        raise ConfigurationError(
            f"{group} {name} declares no config dataclass: annotate its config (`config: MyConfig` on the class, or "
            "the builder's first parameter) with a @dataclass whose fields are the config's keys"
        )
    return schema


def component(target: str | Callable[..., Any], group: str) -> Component:
    factory = locate(target, group)
    return Component(factory, declared_schema(factory, group))


def options(config: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """A config node as a plain dict with interpolations resolved (data.tokenizer: ${model.tokenizer})."""
    if isinstance(config, DictConfig):
        return OmegaConf.to_container(config, resolve=True)  # type: ignore[return-value]
    return dict(config)


class Registry(MutableMapping[str, Component]):
    """Components by name: entry points of one group, plus entries set in-process (tests, the audit's canaries)."""

    def __init__(self, group: str, entry_point_group: str, error: type[ConfigurationError] = ConfigurationError):
        self.group = group
        self.entry_point_group = entry_point_group
        self.error = error
        self._set: dict[str, Component] = {}
        self._loaded: dict[str, Component] = {}

    @cached_property
    def _entry_points(self) -> dict[str, list[EntryPoint]]:
        found: dict[str, list[EntryPoint]] = {}
        for point in entry_points(group=self.entry_point_group):
            if point.value not in {p.value for p in found.get(point.name, [])}:
                found.setdefault(point.name, []).append(point)
        return found

    def component(self, name: str) -> Component:
        if name in self._set:
            return self._set[name]
        if name in self._loaded:
            return self._loaded[name]
        points = self._entry_points.get(name)
        if not points:
            known = sorted(self)
            hint = "" if known else " (no entry points at all: install dpbench with `pip install -e .`)"
            raise self.error(f"unknown {self.group} {name!r}; choose one of {known}{hint}, or give the node a "
                             f"{TARGET} naming your own factory")
        if len(points) > 1:
            raise self.error(f"{self.group} {name!r} is declared by several entry points of group "
                             f"{self.entry_point_group!r}: {[p.value for p in points]}; uninstall all but one")
        try:
            loaded = points[0].load()
        except Exception as error:
            raise self.error(f"{self.group} {name!r} (entry point {points[0].value}) failed to import: {error!r}") \
                from None
        self._loaded[name] = component(loaded, self.group)
        return self._loaded[name]

    def resolve(self, config: Mapping[str, Any]) -> tuple[Component, dict[str, Any]]:
        """The component a config node asks for (its `_target_`, else its `name`) and its options minus `_target_`."""
        settings = dict(config)
        target = settings.pop(TARGET, None)
        if target is not None:
            return component(target, self.group), settings
        name = settings.get("name")
        if name is None:
            raise self.error(f"the {self.group} config has neither `name` nor `{TARGET}`")
        return self.component(str(name)), settings

    def build(self, config: DictConfig | Mapping[str, Any], *args: Any) -> Any:
        """factory(validated config, *args)."""
        found, typed = self.validated(config)
        return found.factory(typed, *args)

    def check(self, config: DictConfig | Mapping[str, Any]) -> None:
        """Refuse an unknown name or key of the node now, before a run loads data for what `build` needs."""
        self.validated(config)

    def validated(self, config: DictConfig | Mapping[str, Any]) -> tuple[Component, Any]:
        """The component a node asks for and the node merged into its schema (an unknown key refused)."""
        found, settings = self.resolve(options(config))
        return found, validated(found.schema, settings, self.group)

    def defaults(self, name: str) -> dict[str, Any]:
        """The config node `group=name` stands for: the schema's defaults, named."""
        node = OmegaConf.to_container(OmegaConf.structured(self.component(name).schema))
        return {**node, "name": name}  # type: ignore[dict-item]

    def __getitem__(self, name: str) -> Component:
        try:
            return self.component(name)
        except ConfigurationError:
            raise KeyError(name) from None

    def __setitem__(self, name: str, found: Component) -> None:
        if not isinstance(found, Component):
            raise TypeError(f"{self.group} {name!r}: set a dpbench.core.registry.Component(factory, schema), not "
                            f"{type(found).__name__}")
        self._set[name] = found

    def __delitem__(self, name: str) -> None:
        del self._set[name]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(set(self._entry_points) | set(self._set)))

    def __len__(self) -> int:
        return len(set(self._entry_points) | set(self._set))

    def __contains__(self, name: object) -> bool:
        return name in self._set or name in self._entry_points
