"""Every command the README and the docs pages show is composed (each job of a multirun grid) or, for the other tools,
started.

A README command that fails on a fresh clone ("Multiple values for experiment") is a bug a user meets first.
"""

import re
import runpy
import shlex
import sys

import pytest
from hydra import compose
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_config_search_path
from hydra.core.config_search_path import SearchPathQuery
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dpbench.app.hydra_setup import config_dir, setup
from dpbench.core.config import Config, validated
from tests.helpers.cli import ROOT

PAGES = [ROOT / "README.md", *(ROOT / "docs" / f"{page}.md" for page in (
    "configuration", "privacy", "architecture", "methods", "plugins", "scale", "resume", "leaderboard-guide"))]
"""The README and the reference pages it links (the generated leaderboard report apart)."""
COMMAND = re.compile(r"^(?:[A-Z_]+=\S+\s+)*python -m (dpbench[\w.]*)(.*)$")


def readme_commands() -> list[tuple[str, list[str]]]:
    """(module, arguments) of every `python -m dpbench...` line inside the pages' code blocks."""
    commands, in_block = [], False
    for line in "\n".join(page.read_text() for page in PAGES).splitlines():
        if line.startswith("```"):
            in_block = not in_block
            continue
        match = COMMAND.match(line.strip()) if in_block else None
        if match and "->" not in match.group(2):  # an architecture sketch, not a command
            arguments = match.group(2).split(" #")[0]
            commands.append((match.group(1), shlex.split(arguments)))
    return commands


RUNS = [args for module, args in readme_commands() if module == "dpbench"]
TOOLS = sorted({module for module, _ in readme_commands() if module != "dpbench"})


def _split(args: list[str]) -> tuple[bool, str | None, str, list[str]]:
    multirun, directory, name, overrides = False, None, "config", []
    items = iter(args)
    for arg in items:
        if arg in ("-m", "--multirun"):
            multirun = True
        elif arg == "--config-dir":
            directory = next(items)
        elif arg == "--config-name":
            name = next(items)
        else:
            overrides.append(arg)
    return multirun, directory, name, overrides


def _jobs(name: str, overrides: list[str], multirun: bool) -> list[list[str]]:
    """The job override lists Hydra's basic sweeper would launch (a sweeper plugin's search space: first point)."""
    if not multirun:
        return [overrides]
    sweep = compose(name, overrides=[o for o in overrides if "," not in o.partition("=")[2]],
                    return_hydra_config=True)
    params = sweep.hydra.sweeper.get("params")
    params = OmegaConf.to_container(params) if params else {}
    grid = [f"{key}={value}" for key, value in params.items()] + overrides
    jobs: list[list[str]] = [[]]
    for parsed in OverridesParser.create().parse_overrides(grid):
        if parsed.is_sweep_override() and parsed.is_discrete_sweep():
            values = [f"{parsed.get_key_element()}={value}" for value in parsed.sweep_string_iterator()]
        elif parsed.is_sweep_override():  # interval()/range() of a search sweeper: its own plugin expands it
            continue
        else:
            values = [parsed.input_line]
        jobs = [job + [value] for job in jobs for value in values]
    return jobs


@pytest.mark.parametrize("args", RUNS, ids=[" ".join(args) or "(default)" for args in RUNS])
def test_readme_run_command_composes(args):
    multirun, directory, name, overrides = _split(args)
    setup()
    _start_hydra_as_the_cli_does(directory)
    try:
        jobs = _jobs(name, overrides, multirun)
        assert jobs
        for job in jobs:
            try:
                cfg = compose(name, overrides=job)
            except (HydraException, OmegaConfBaseException) as error:
                pytest.fail(f"`python -m dpbench {' '.join(args)}` fails to compose job {job}: {error}")
            validated(Config, cfg, "top-level")
    finally:
        GlobalHydra.instance().clear()


def _start_hydra_as_the_cli_does(directory: str | None) -> None:
    """conf/ as the main config dir and `--config-dir` prepended to the search path, as hydra.main does."""
    GlobalHydra.instance().clear()
    search_path = create_config_search_path(config_dir())
    if directory:
        extra = f"file://{(ROOT / directory).resolve()}"
        search_path.prepend("command-line", extra, SearchPathQuery(provider="schema"))
    Hydra.create_main_hydra2(task_name="dpbench", config_search_path=search_path)


def test_readme_shows_the_runs_it_should():
    assert len(RUNS) >= 10 and [] in RUNS  # the default run is among them


@pytest.mark.parametrize("module", TOOLS)
def test_readme_tool_starts(module, capsys, monkeypatch):
    """`python -m MODULE --help`, run in this process (imports shared: seconds, not a process start each)."""
    monkeypatch.setattr(sys, "argv", [module, "--help"])
    with pytest.raises(SystemExit) as stop:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert stop.value.code in (0, None)
    assert capsys.readouterr().out.strip()
