"""The suite file (conf/leaderboard/suite.yaml) as typed objects: tasks, methods and one profile's grid."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from dpbench.core.errors import ConfigurationError
from dpbench.core.methods import method_label
from dpbench.leaderboard.grid import DEFAULT_SCORE_NOISE, GridSpec


@dataclass(frozen=True)
class Variant:
    """One concrete configuration of a method (a ladder method has one per rung, e.g. JL at r = 5)."""

    name: str
    label: str
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class Method:
    name: str
    label: str
    overrides: tuple[str, ...]
    optimizer: str
    private: bool = True
    ladder_key: str | None = None
    ladder_short: str = ""
    ladder_values: tuple[Any, ...] = ()
    keep: int = 1

    def variants(self) -> list[Variant]:
        """The rungs in increasing order; a method without a ladder is its own single variant."""
        if self.ladder_key is None:
            return [Variant(self.name, self.label, self.overrides)]
        return [Variant(f"{self.name}_{self.ladder_short}{value}", f"{self.label} ({self.ladder_short}={value})",
                        (*self.overrides, f"{self.ladder_key}={value}")) for value in self.ladder_values]


@dataclass(frozen=True)
class Anchor:
    """A published number: which method, at which budget, in which paper, table and setting."""

    method: str
    epsilon: float | None
    value: float
    source: str


@dataclass(frozen=True)
class Task:
    name: str
    title: str
    overrides: tuple[str, ...]
    optimizer: str
    lr: dict[str, tuple[float, float]]
    clip: tuple[float, float]
    validation_size: int
    methods: tuple[Method, ...]
    delta: float
    """The suite's delta unless the task sets its own (a training set too large for it to lie below 1/N^1.1)."""
    requires: str | None = None
    note: str | None = None
    """Printed under the task's title in the report: what a reader must know to read its table."""
    chance: float | None = None
    """What a constant prediction scores on the test split: the majority class's accuracy, or a loss task's best
    constant-score loss. No claim is judged nor winner named where nothing beats it."""
    anchors: tuple[Anchor, ...] = ()
    """Published figures this task reproduces, shown beside the cell that reproduces each."""
    cost_only: bool = False
    """Nothing learns here at any budget tried: the task's speed and memory are shown, its metric is not ranked."""
    fixed: tuple[float, float | None] | None = None
    """(lr, clip): a published recipe's hyperparameters, run as they are instead of tuned (a paper's anchor)."""
    budgets: tuple[float, ...] | None = None
    """The profile's budgets this task runs at, where it runs fewer (a paper's anchor at its own epsilon)."""
    noise_multiplier: float | None = None
    """A published anchor's own noise multiplier, run as it is instead of calibrated to the budget (the budget is then
    only the row the cell is listed under; its spent epsilon is what that noise spends): like-for-like anchors."""
    reduced: str | None = None
    """What was cut from a paper's own setting that this machine cannot run (epochs, learning rates, corpus): printed
    beside the task's table and each claim judged on it, so a verdict is read as one outside the paper's regime."""
    at_budget: tuple[tuple[str, float, tuple[str, ...]], ...] = ()
    """(method, budget, overrides) added to that method's cells at that budget: a setting that depends on the budget,
    e.g. sparse's per-run selection epsilon where a profile's budget is a total and no run has an epsilon of its
    own to take a share of."""

    earlier_rounds: tuple[tuple[str, float, int], ...] = ()
    """(variant, budget, trials) of a tuning round run on this data and discarded (a range moved mid-run): its
    spend is in no cell's total, so the report adds it beside the total of each cell it preceded."""

    def earlier_trials(self, variant: str, epsilon: float | None) -> int:
        """The trials of the discarded round that preceded `variant`'s cells at `epsilon` (0: none)."""
        return next((trials for name, budget, trials in self.earlier_rounds
                     if name == variant and budget == epsilon), 0)

    def budget_overrides(self, method: Method, epsilon: float | None) -> tuple[str, ...]:
        """The overrides at_budget gives `method`'s cells at `epsilon` (none for another budget or method)."""
        return next((overrides for name, budget, overrides in self.at_budget
                     if name == method.name and budget == epsilon), ())

    def skip_reason(self) -> str | None:
        """Why the task cannot run on this machine (its data is not installed), or None."""
        if self.requires and not Path(self.requires).exists():
            return f"skipped: {self.requires} does not exist (its data is not installed on this machine)"
        return None

    def optimizer_of(self, method: Method) -> str:
        return self.optimizer if method.optimizer == "task" else method.optimizer


TOTAL, PER_RUN = "total", "per_run"
"""What a profile's budgets mean (its `budget:` key)."""


@dataclass(frozen=True)
class Suite:
    profile: str
    delta: float
    common: tuple[str, ...]
    budgets: tuple[float, ...]
    tune_epsilon: float
    """The budget whose costs the report shows, and where a profile that does not tune at every budget tunes."""
    tuning: GridSpec
    seeds: tuple[int, ...]
    """The evaluation seeds: every chosen point trains once per seed and is tested; none of them tunes."""
    tasks: tuple[Task, ...]
    path: Path
    omitted: tuple[str, ...] = ()
    """Tasks of the suite file that this profile leaves out."""
    tuning_seed: int = 0
    """The seed of every selection run (a tuning trial), apart from the evaluation seeds."""
    smoke: bool = False
    """A smoke profile shows the machinery: it may run fewer than MIN_EVALUATION_SEEDS, and the report says so."""
    budget: str = PER_RUN
    """TOTAL: each budget is what a cell's whole procedure spends (its trials, their noisy scores, every final
    run), each run's noise calibrated so; PER_RUN: each run alone spends the budget, the tuning uncounted (a smoke
    profile's, or --private-tuning's, which counts its own)."""
    choice: str | None = None
    """Why the profile runs these tasks, methods, budgets and seeds (what fits its machine time): the report
    states it."""

    @property
    def total(self) -> bool:
        return self.budget == TOTAL

    @property
    def trials(self) -> int:
        """Trials per method and budget on the first range of the grid."""
        return self.tuning.trials

    def tuning_budget(self, epsilon: float | None) -> float | None:
        """The budget a method's trials run at for its runs at `epsilon` (None: a non-private method)."""
        if epsilon is None:
            return None
        return epsilon if self.tuning.each_budget else self.tune_epsilon


def default_suite_path() -> Path:
    from dpbench.app.hydra_setup import config_dir

    return Path(config_dir()) / "leaderboard" / "suite.yaml"


def _pair(value: Any, where: str) -> tuple[float, float]:
    if not (isinstance(value, list | tuple) and len(value) == 2 and 0 < float(value[0]) <= float(value[1])):
        raise ConfigurationError(f"{where} must be a range [low, high] with 0 < low <= high, got {value!r}")
    return float(value[0]), float(value[1])


def _method(name: str, spec: dict[str, Any], where: Path) -> Method:
    ladder = spec.get("ladder") or {}
    optimizer = spec.get("optimizer", "task")
    if optimizer not in ("sgd", "adam", "task"):
        raise ConfigurationError(f"{where}: methods.{name}.optimizer must be sgd, adam or task, got {optimizer!r}")
    return Method(
        name=name, label=str(spec.get("label", "")), overrides=tuple(spec.get("overrides", [])),
        optimizer=optimizer, private=bool(spec.get("private", True)), ladder_key=ladder.get("key"),
        ladder_short=str(ladder.get("short", "")), ladder_values=tuple(ladder.get("values", [])),
        keep=int(ladder.get("keep", 1)),
    )


def _anchors(task: str, raw: list[dict[str, Any]], where: Path) -> tuple[Anchor, ...]:
    anchors = []
    for spec in raw:
        missing = {"method", "value", "paper", "where", "setting"} - set(spec)
        if missing:
            raise ConfigurationError(f"{where}: tasks.{task}.anchors entry {spec} lacks {sorted(missing)}")
        source = f"{spec['paper']}, {spec['where']}: {spec['setting']}"
        epsilon = spec.get("epsilon")
        anchors.append(Anchor(str(spec["method"]), None if epsilon is None else float(epsilon), float(spec["value"]),
                              source))
    return tuple(anchors)


def _fixed(task: str, raw: dict[str, Any] | None, where: Path) -> tuple[float, float | None] | None:
    if raw is None:
        return None
    if set(raw) - {"lr", "clip"} or "lr" not in raw:
        raise ConfigurationError(f"{where}: tasks.{task}.fixed takes lr (and clip), got {sorted(raw)}")
    return float(raw["lr"]), None if raw.get("clip") is None else float(raw["clip"])


def _grid(raw: dict[str, Any], where: str) -> GridSpec:
    unknown = set(raw) - {"lr_points", "clip_points", "max_growth", "each_budget", "trials", "score_noise"}
    if unknown:
        raise ConfigurationError(f"{where}.tuning has unknown keys {sorted(unknown)}")
    try:
        return GridSpec(int(raw["lr_points"]), int(raw["clip_points"]), float(raw["max_growth"]),
                        bool(raw["each_budget"]), None if raw.get("trials") is None else int(raw["trials"]),
                        _score_noise(raw.get("score_noise", DEFAULT_SCORE_NOISE)))
    except KeyError as missing:
        raise ConfigurationError(f"{where}.tuning lacks {missing}") from None


def _score_noise(raw: float | dict[Any, Any]) -> float | dict[float, float]:
    """One noise multiplier, or one per budget ({1: 20, 3: 10, 8: 5})."""
    if isinstance(raw, dict):
        return {float(budget): float(noise) for budget, noise in raw.items()}
    return float(raw)


def _budget(chosen: dict[str, Any], tuning: GridSpec, smoke: bool, where: str) -> str:
    """The profile's `budget:` (per_run unless set); a headline profile must count its tuning, and a total needs a
    fixed number of trials at every budget."""
    budget = str(chosen.get("budget", PER_RUN))
    if budget not in (TOTAL, PER_RUN):
        raise ConfigurationError(f"{where}: budget must be {TOTAL} or {PER_RUN}, got {budget!r}")
    if budget == PER_RUN and not smoke:
        raise ConfigurationError(f"{where}: a profile that is not a smoke profile reports headline budgets, which "
                                 f"must include the tuning: set `budget: {TOTAL}` (or mark it `smoke: true`)")
    if budget == TOTAL and (tuning.grows or not tuning.each_budget):
        raise ConfigurationError(f"{where}: `budget: {TOTAL}` counts a fixed number of trials at each budget: set "
                                 f"tuning.max_growth: 1 and tuning.each_budget: true")
    return budget


def _per_budget(key: str, by_budget: Any, budgets: tuple[float, ...], values: str) -> list[tuple[float, Any]]:
    """A `{budget: value}` mapping's pairs, refused where it is no mapping or names a budget the task does not run."""
    if not isinstance(by_budget, dict):
        raise ConfigurationError(f"{key} must map budgets to {values}, got {by_budget!r}")
    for budget in by_budget:
        if float(budget) not in budgets:
            raise ConfigurationError(f"{key} names budget {budget}, not one of the task's budgets {list(budgets)}")
    return [(float(budget), value) for budget, value in by_budget.items()]


def _at_budget(task: str, raw: Any, methods: dict[str, Method], budgets: tuple[float, ...], each_budget: bool,
               where: Path) -> tuple[tuple[str, float, tuple[str, ...]], ...]:
    """A profile task entry's `at_budget: {method: {budget: [overrides]}}`, refused where it would not take effect as
    written: a method or budget the task does not run, a non-private method (its cells have no budget), a profile
    whose trials all run at one budget, or a value that is not a list of overrides."""
    if raw is None:
        return ()
    key = f"{where}: tasks.{task}.at_budget"
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{key} must map methods to {{budget: [overrides]}}, got {raw!r}")
    if not each_budget:
        raise ConfigurationError(f"{key} needs tuning.each_budget: true (otherwise every trial runs at one budget "
                                 "and its final runs at another's settings)")
    entries = []
    for name, by_budget in raw.items():
        if name not in methods:
            raise ConfigurationError(f"{key} names {name!r}, not one of its methods {list(methods)}")
        if not methods[name].private:
            raise ConfigurationError(f"{key} names {name!r}, a non-private method: its cells have no budget")
        for budget, overrides in _per_budget(f"{key}.{name}", by_budget, budgets, "lists of overrides"):
            if not isinstance(overrides, list) or not all(isinstance(item, str) for item in overrides):
                raise ConfigurationError(f"{key}.{name}.{budget:g} must be a list of overrides, got {overrides!r}")
            entries.append((name, budget, tuple(overrides)))
    return tuple(entries)


def _earlier_rounds(task: str, raw: Any, methods: list[Method], budgets: tuple[float, ...], total: bool,
                    where: Path) -> tuple[tuple[str, float, int], ...]:
    """A profile task entry's `earlier_rounds: {variant: {budget: trials}}`, refused outside a `budget: total`
    profile (a per-run profile has no total to count them in), for a variant or budget the task does not run
    privately, or for a count of trials that is not a positive integer."""
    if raw is None:
        return ()
    key = f"{where}: tasks.{task}.earlier_rounds"
    if not total:
        raise ConfigurationError(f"{key} needs `budget: {TOTAL}`: a per-run profile has no total to count them in")
    variants = [v.name for m in methods if m.private for v in m.variants()]
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{key} must map variants to {{budget: trials}}, got {raw!r}")
    entries = []
    for name, by_budget in raw.items():
        if name not in variants:
            raise ConfigurationError(f"{key} names {name!r}, not one of its private variants {variants}")
        for budget, trials in _per_budget(f"{key}.{name}", by_budget, budgets, "trial counts"):
            if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
                raise ConfigurationError(f"{key}.{name}.{budget:g} must be a positive number of trials, got "
                                         f"{trials!r}")
            entries.append((name, budget, trials))
    return tuple(entries)


TASK_ENTRY_KEYS = frozenset({"methods", "overrides", "at_budget", "earlier_rounds"})
"""What a profile may say of a task: any other key is a typo that would leave a setting silently off."""


def _task_budgets(task: str, own: list[float] | None, profile_budgets: list[float], profile: str,
                  where: Path) -> tuple[float, ...] | None:
    """Those of a task's own budgets that the profile runs (a smoke profile runs fewer); none left is an error."""
    if own is None:
        return None
    runs = {float(b) for b in profile_budgets}
    kept = tuple(float(b) for b in own if float(b) in runs)
    if not kept:
        raise ConfigurationError(f"{where}: tasks.{task}.budgets {list(own)} has none of profile {profile!r}'s budgets "
                                 f"{list(profile_budgets)}: add one of them to the task's budgets")
    return kept


def chosen_in(overrides: list[str] | tuple[str, ...], group: str) -> str | None:
    """The option of a config group (privatizer, optimizer) a method's or cell's overrides choose (the last one wins,
    as in Hydra)."""
    chosen = [item.split("=", 1)[1] for item in overrides if item.split("=", 1)[0].lstrip("+") == group]
    return chosen[-1] if chosen else None


def _labelled(method: Method, task_optimizer: str) -> Method:
    """A method without a label of its own is named with the optimizer it runs with on the task (non-private SGD,
    DP-Adam-JL): `optimizer: task` alone would hide which."""
    if method.label:
        return method
    privatizer = chosen_in(method.overrides, "privatizer") or method.name
    optimizer = task_optimizer if method.optimizer == "task" else method.optimizer
    return replace(method, label=method_label(privatizer, optimizer))


def load_suite(profile: str, path: Path | None = None) -> Suite:
    """Read one profile (`full`, `quick`, ...) of a suite file into a Suite."""
    path = Path(path or default_suite_path())
    if not path.exists():
        raise ConfigurationError(f"suite file {path} does not exist")
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    profiles = raw.get("profiles", {})
    if profile not in profiles:
        raise ConfigurationError(f"{path}: no profile {profile!r}; choose one of {sorted(profiles)}")
    chosen = profiles[profile]
    methods = {name: _method(name, spec, path) for name, spec in raw.get("methods", {}).items()}
    for name, values in (chosen.get("ladders") or {}).items():  # a profile may climb fewer rungs
        if name not in methods or methods[name].ladder_key is None:
            raise ConfigurationError(f"{path}: profile {profile!r} ladders names {name!r}, not a method with a ladder")
        methods[name] = replace(methods[name], ladder_values=tuple(values))
    tasks = []
    for task_name, entry in chosen["tasks"].items():
        spec = raw.get("tasks", {}).get(task_name)
        if spec is None:
            raise ConfigurationError(f"{path}: profile {profile!r} names task {task_name!r}, which `tasks` lacks")
        extra = sorted(set(entry) - TASK_ENTRY_KEYS)
        if extra:
            raise ConfigurationError(f"{path}: profile {profile!r} task {task_name!r} has unknown keys {extra} (it "
                                     f"takes {sorted(TASK_ENTRY_KEYS)})")
        unknown = [m for m in entry["methods"] if m not in methods]
        if unknown:
            raise ConfigurationError(f"{path}: task {task_name!r} names unknown methods {unknown}")
        own_budgets = _task_budgets(task_name, spec.get("budgets"), chosen["budgets"], profile, path)
        runs_at = own_budgets or tuple(float(b) for b in chosen["budgets"])
        listed = [methods[m] for m in entry["methods"]]
        tasks.append(Task(
            name=task_name, title=str(spec.get("title", task_name)),
            overrides=(*spec.get("overrides", []), *entry.get("overrides", [])),
            optimizer=spec["optimizer"],
            lr={opt: _pair(bounds, f"{path}: tasks.{task_name}.lr.{opt}") for opt, bounds in spec["lr"].items()},
            clip=_pair(spec["clip"], f"{path}: tasks.{task_name}.clip"),
            validation_size=int(spec["validation_size"]),
            methods=tuple(_labelled(methods[m], spec["optimizer"]) for m in entry["methods"]),
            delta=float(spec.get("delta", raw["delta"])),
            requires=spec.get("requires"),
            note=spec.get("note"), chance=None if spec.get("chance") is None else float(spec["chance"]),
            anchors=_anchors(task_name, spec.get("anchors", []), path), cost_only=bool(spec.get("cost_only", False)),
            fixed=_fixed(task_name, spec.get("fixed"), path),
            budgets=own_budgets,
            at_budget=_at_budget(task_name, entry.get("at_budget"), {m.name: m for m in listed}, runs_at,
                                 bool((chosen.get("tuning") or {}).get("each_budget", False)), path),
            earlier_rounds=_earlier_rounds(task_name, entry.get("earlier_rounds"), listed, runs_at,
                                           chosen.get("budget") == TOTAL, path),
            reduced=spec.get("reduced"),
            noise_multiplier=None if spec.get("noise_multiplier") is None else float(spec["noise_multiplier"]),
        ))
    tune_epsilon = float(chosen["tune_epsilon"])
    budgets = tuple(float(b) for b in chosen["budgets"])
    if tune_epsilon not in budgets:
        raise ConfigurationError(f"{path}: profile {profile!r} tune_epsilon {tune_epsilon} is not one of {budgets}")
    seeds = tuple(int(s) for s in chosen["seeds"])
    tuning_seed, smoke = int(chosen.get("tuning_seed", 0)), bool(chosen.get("smoke", False))
    _check_seeds(seeds, tuning_seed, smoke, f"{path}: profile {profile!r}")
    tuning = _grid(chosen.get("tuning") or {}, f"{path}: profiles.{profile}")
    for budget in budgets:
        tuning.score_noise_at(budget)  # a per-budget mapping names every budget, else refused here
    return Suite(
        profile=profile, delta=float(raw["delta"]), common=tuple(raw.get("common", [])), budgets=budgets,
        tune_epsilon=tune_epsilon, tuning=tuning, seeds=seeds, tasks=tuple(tasks), path=path,
        omitted=tuple(name for name in raw.get("tasks", {}) if name not in chosen["tasks"]),
        tuning_seed=tuning_seed, smoke=smoke, budget=_budget(chosen, tuning, smoke, f"{path}: profile {profile!r}"),
        choice=chosen.get("choice"),
    )


MIN_EVALUATION_SEEDS = 5
"""Fresh evaluation seeds a profile needs unless it is a smoke profile: with fewer, a paired t test has too few
degrees of freedom to separate methods a few points apart."""


def _check_seeds(seeds: tuple[int, ...], tuning_seed: int, smoke: bool, where: str) -> None:
    """Selection apart from evaluation: the tuning seed is none of the evaluation seeds, which are distinct and, in
    a profile that is not a smoke profile, at least MIN_EVALUATION_SEEDS."""
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigurationError(f"{where}: seeds {list(seeds)} must be distinct, and at least one")
    if tuning_seed in seeds:
        raise ConfigurationError(f"{where}: tuning_seed {tuning_seed} is also an evaluation seed ({list(seeds)}): "
                                 "evaluate on seeds the selection runs did not use")
    if not smoke and len(seeds) < MIN_EVALUATION_SEEDS:
        raise ConfigurationError(f"{where}: {len(seeds)} evaluation seed(s), the protocol needs at least "
                                 f"{MIN_EVALUATION_SEEDS}: add seeds, or mark the profile `smoke: true` (its report "
                                 "then says its verdicts show the machinery only)")
