"""The layout is a map: the top level holds the commands, the public API and one-release aliases only, and importing
any module of dpbench defines things and does nothing else (no Hydra schema registered, no logging handler, no
global torch hook). The layers and the absence of import cycles are import-linter's contracts (`make lint`)."""

import subprocess
import sys

from tests.helpers.cli import ROOT

TOP_LEVEL = {"__init__", "__main__", "cli", "components", "plan", "capacity", "jl_curve"}
ALIASES = {"list", "profile", "tasks"}  # moved module paths, kept for one release
PACKAGES = {"core", "data", "models", "privacy", "profiling", "privatizers", "training", "app", "report",
            "leaderboard", "audit"}

IMPORT_EVERYTHING = """
import importlib, logging, pkgutil
import torch
from hydra.core.config_store import ConfigStore
import dpbench
schemas, handlers = set(ConfigStore.instance().repo), list(logging.getLogger().handlers)
names = [m.name for m in pkgutil.walk_packages(dpbench.__path__, "dpbench.") if not m.name.endswith("__main__")]
for name in names:
    importlib.import_module(name)
hooks = [torch.nn.modules.module._global_forward_hooks, torch.nn.modules.module._global_backward_hooks,
         torch.nn.modules.module._global_forward_pre_hooks]
assert set(ConfigStore.instance().repo) == schemas, set(ConfigStore.instance().repo) - schemas
assert logging.getLogger().handlers == handlers
assert not any(hooks), hooks
print(len(names))
"""


def test_the_top_level_holds_commands_the_public_api_and_aliases_only():
    package = ROOT / "dpbench"
    modules = {path.stem for path in package.glob("*.py")}
    folders = {path.name for path in package.iterdir() if path.is_dir() and (path / "__init__.py").exists()}
    assert modules == TOP_LEVEL | ALIASES
    assert folders == PACKAGES
    for alias in ALIASES:
        assert "one release" in (package / f"{alias}.py").read_text()


def test_importing_every_module_only_defines_things():
    done = subprocess.run([sys.executable, "-c", IMPORT_EVERYTHING], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.strip()) > 150
