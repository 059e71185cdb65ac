"""`python -m dpbench.components`: every name a run accepts (built-in, preset, plugin, the user's `_target_`) with the
keys and defaults `GROUP.KEY=VALUE` works on, so a user need not read conf/ or the dataclasses to find them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dpbench.components import main
from tests.helpers.cli import ROOT

EXAMPLES = ROOT / "examples"


def _fake_distribution(root: Path, name: str, lines: str) -> None:
    """An installed package declaring dpbench entry points, as `pip install my-clip` would leave it."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(lines)


def _entry(out: str, group: str, name: str) -> str:
    """The lines `name` takes up under `group`'s heading."""
    section = out.split(f"\n{group}  (")[1] if not out.startswith(f"{group}  (") else out.split("\n", 1)[1]
    section = section.split("\n\n")[0]
    found = re.search(rf"^  {name} +(.*(?:\n {{4,}}\S.*)*)", section, re.MULTILINE)
    assert found, f"{name} is not listed under {group}:\n{section}"
    return " ".join(found.group(1).split())


def test_every_group_from_any_directory_with_plugins_presets_and_your_own_configs(tmp_path):
    _fake_distribution(tmp_path, "my-clip", "[dpbench.privatizers]\nmy_clip = auto_clip:AutoClipping\n"
                       "broken_clip = no_such_module:Clip\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(EXAMPLES)]), "WANDB_MODE": "disabled",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "dpbench.components", "--config-dir", str(EXAMPLES / "conf")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    headings = re.findall(r"^(\w+)  \((.*)\)$", text, re.MULTILINE)
    assert headings == [("model", "model=NAME, model.KEY=VALUE"), ("data", "data=NAME, data.KEY=VALUE"),
                        ("privatizer", "privatizer=NAME, privatizer.KEY=VALUE"),
                        ("optimizer", "optimizer=NAME, optimizer.KEY=VALUE"), ("experiment", "+experiment=NAME"),
                        ("sweep", "+sweep=NAME")]
    # built-ins: every key of the dataclass, with the value the name gives it (the yaml preset over the dataclass)
    assert _entry(text, "privatizer", "vanilla") == "built-in engine=auto chunk_size=null"
    assert "gamma=0.01 noise_decay=inverse_sqrt" in _entry(text, "privatizer", "d2p2")
    assert _entry(text, "privatizer", "jl_r5") == ("preset of jl: projections=5 projections=5 chunk_size=null "
                                                   "compile=false")
    assert _entry(text, "model", "cnn") == "built-in activation=tanh padding=3"
    assert "pooling=model lora.rank=null lora.targets=null lora.alpha=null lora.dropout=0.0" in _entry(
        text, "model", "minilm")  # a nested node as the dotted keys an override types
    assert "vocab_size=8000 max_length=150" in _entry(text, "data", "rotten_tomatoes")
    assert _entry(text, "data", "mnist5k").startswith("built-in")
    assert "lr=0.001" in _entry(text, "optimizer", "adam") and "betas=[0.9,0.999]" in _entry(text, "optimizer", "adam")
    # plugins: an installed package's entry point, one that fails to import, and configs of the user's --config-dir
    assert _entry(text, "privatizer", "my_clip") == "plugin (my-clip) gamma=0.01"
    assert _entry(text, "privatizer", "broken_clip").startswith("cannot be listed: privatizer 'broken_clip' "
                                                                 "(entry point no_such_module:Clip) failed to import")
    assert _entry(text, "privatizer", "per_layer") == "_target_: my_privatizer.PerLayerClipping"
    assert _entry(text, "privatizer", "auto_clip") == "_target_: auto_clip.AutoClipping gamma=0.01"
    assert _entry(text, "model", "mlp") == "_target_: my_mlp.build_mlp hidden=64"
    # experiments and sweeps: the first sentence of their description
    assert _entry(text, "sweep", "compare_privatizers").startswith("Grid:")
    assert _entry(text, "experiment", "dpsgd_mnist5k").startswith("The default run spelled out")
    assert list(tmp_path.iterdir()) == [tmp_path / "my-clip-0.1.dist-info"]  # listing writes nothing


def test_one_group_and_a_mistyped_group(capsys):
    assert main(["optimizer"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("optimizer  (") and "\n  sgd " in out and "privatizer" not in out
    with pytest.raises(SystemExit) as refused:
        main(["privatiser"])
    assert refused.value.code == 2
    assert "unknown group privatiser; choose from model, data, privatizer" in capsys.readouterr().err
