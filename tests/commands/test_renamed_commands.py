"""The commands moved by the layout of 0.1 (`list` -> `components`, `profile` -> `capacity`, `privacy.jl_curve` ->
`jl_curve`): the old paths still run the new commands for one release and say so, and the JL curve's figures hold
the order Bu et al.'s Figure 3 shows."""

import csv
import math
import subprocess
import sys

import pytest

from tests.helpers.cli import ROOT


def _module(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("old", "new", "args"), [
    ("dpbench.list", "dpbench.components", ["optimizer"]),
    ("dpbench.profile", "dpbench.capacity", ["--help"]),
])
def test_old_command_names_run_the_new_commands_and_warn(old, new, args):
    renamed, current = _module(old, *args), _module(new, *args)
    assert renamed.returncode == current.returncode == 0, renamed.stderr
    assert renamed.stdout == current.stdout
    assert f"python -m {old} is now python -m {new}" in renamed.stderr
    assert "is now" not in current.stderr


def test_jl_curve_epsilon_falls_with_r_toward_vanilla_and_grows_with_epochs(tmp_path):
    """Old and new paths write the same table; epsilon(r) decreases in r and stays above vanilla's; every row grows
    with the epochs."""
    args = ["--sigma", "1.0", "--batch-size", "100", "--train-size", "10000", "--epochs", "3", "--points", "1,3",
            "--projections", "3,10,100"]
    renamed = _module("dpbench.privacy.jl_curve", *args, "--out", str(tmp_path / "old"))
    current = _module("dpbench.jl_curve", *args, "--out", str(tmp_path / "new"))
    assert renamed.returncode == current.returncode == 0, current.stderr
    assert "python -m dpbench.privacy.jl_curve is now python -m dpbench.jl_curve" in renamed.stderr
    tables = [(tmp_path / folder / "jl_privacy_curve.csv").read_text() for folder in ("old", "new")]
    assert tables[0] == tables[1]
    rows = {row["r"]: (float(row["epoch_1"]), float(row["epoch_3"])) for row in csv.DictReader(tables[1].splitlines())}
    assert all(math.isfinite(value) for row in rows.values() for value in row)
    for epoch in (0, 1):
        assert rows["3"][epoch] > rows["10"][epoch] > rows["100"][epoch] > rows["vanilla"][epoch] > 0
    assert all(first < last for first, last in rows.values())
    assert (tmp_path / "new" / "jl_privacy_curve.png").stat().st_size > 0
