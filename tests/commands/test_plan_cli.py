"""`python -m dpbench.plan`: the privacy plan a run would fix (the same composition, the same sigma), without
training, output directories or the sweep report."""

from __future__ import annotations

import re

from tests.helpers.cli import ROOT, dpbench, plan, results

LINE = re.compile(r"sigma=(?P<sigma>[\d.e+-]+) q=(?P<q>[\d.e+-]+) steps=(?P<steps>\d+) epsilon=(?P<epsilon>[\d.e+-]+)")


def test_plan_is_the_plan_the_run_trains_with(tmp_path):
    overrides = ["+experiment=dpsgd_mnist5k", "max_steps=4", "privacy.epsilon=2", "batch_size=250"]
    out = plan(*overrides, f"hydra.run.dir={tmp_path / 'planned'}")
    assert out.returncode == 0, out.stderr
    found = LINE.search(out.stdout)
    assert found, out.stdout
    assert not (tmp_path / "planned").exists()

    run_dir = tmp_path / "run"
    trained = dpbench(*overrides, "trainer.enable_progress_bar=false", f"hydra.run.dir={run_dir}")
    assert trained.returncode == 0, trained.stderr
    ran = results(run_dir)
    assert float(found["sigma"]) == float(f"{ran['noise_multiplier']:.6g}")
    assert float(found["q"]) == float(f"{ran['sampling_rate']:.6g}") == 250 / 4000
    assert int(found["steps"]) == ran["steps"] == 4
    assert float(found["epsilon"]) == float(f"{ran['planned_epsilon']:.4g}") <= 2.0


def test_plan_of_a_grid_one_line_per_job_with_plugins_and_refusals(tmp_path):
    sweep = tmp_path / "sweep"
    out = plan("-m", "--config-dir", "examples/conf", "model=mlp", "privatizer=nonprivate,per_layer,jl_r1",
               "privacy.epsilon=1,3", "max_steps=5", f"hydra.sweep.dir={sweep}",
               pythonpath=str(ROOT / "examples"))
    assert out.returncode == 2, out.stderr  # jl with r=1 cannot reach any finite epsilon
    lines = out.stdout.strip().splitlines()
    assert [line[:3] for line in lines] == [f"[{i}]" for i in range(6)]
    assert all("not private" in line for line in lines[:2])
    sigmas = []
    for line, target in zip(lines[2:4], (1, 3), strict=True):
        assert f"privacy.epsilon={target}" in line and "per_layer (SGD) on mnist5k / mlp" in line
        found = LINE.search(line)
        assert float(found["epsilon"]) <= target and int(found["steps"]) == 5
        sigmas.append(float(found["sigma"]))
    assert sigmas[0] > sigmas[1]
    assert all("refused" in line and "unreachable" in line for line in lines[4:])
    assert not sweep.exists() and "sweep summary" not in out.stdout
