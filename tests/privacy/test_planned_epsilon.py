"""A run is what it claims: JL's default r has a finite epsilon, an infinite or far-too-large epsilon is refused unless
the user opts in (naming the real lever), a calibration that stops at its noise floor says so, and every shipped
experiment and JL sweep column plans a finite epsilon within privacy.max_epsilon."""

import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dpbench.app import hydra_setup
from dpbench.app.run import prepare_run
from dpbench.core.errors import ConfigurationError, MissingDataError
from dpbench.privacy.calibration import SIGMA_MIN
from tests.helpers.cli import FAST, ROOT, dpbench, results

EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
JL_SWEEPS = sorted(p.stem for p in (ROOT / "conf" / "sweep").glob("jl_*.yaml"))


def plan_of(*overrides: str):
    return prepare_run(hydra_setup.compose(overrides))


def test_default_jl_plans_a_finite_epsilon_at_the_default_budget():
    prepared = plan_of("privatizer=jl")
    assert prepared.config.privacy.epsilon == 3.0 and prepared.strategy.config.projections == 10
    assert 2.9 <= prepared.plan.planned_epsilon <= 3.0 and not prepared.plan.floor_hit


def test_an_unreachable_jl_target_names_projections_and_the_smallest_r():
    with pytest.raises(ConfigurationError) as refused:
        plan_of("privatizer=jl", "privatizer.projections=1", "privacy.epsilon=100", "max_steps=3")
    error = str(refused.value)
    assert "unreachable" in error and "privatizer.projections=1" in error
    assert "privatizer.projections=2 is the smallest" in error and "lower the batch size" not in error


def test_an_infinite_fixed_noise_run_is_refused_before_training_unless_opted_in(tmp_path: Path):
    overrides = ("privatizer=jl_r1", "privacy.epsilon=null", "privacy.noise_multiplier=0.6", "max_steps=3",
                 "privacy.max_epsilon=null")  # no limit on finite epsilons is no licence for an infinite one
    run = dpbench(*overrides, f"hydra.run.dir={tmp_path}", *FAST)
    assert run.returncode == 2, run.stderr[-3000:]
    error = run.stderr.strip().splitlines()[-1]
    assert "infinite" in error and "privatizer.projections=1" in error and "to a finite epsilon" in error
    assert "privacy.allow_infinite_epsilon=true" in error
    assert not (tmp_path / "results.json").exists() and not (tmp_path / "checkpoints").exists()
    allowed = plan_of(*overrides, "privacy.allow_infinite_epsilon=true")
    assert math.isinf(allowed.plan.planned_epsilon)


def test_an_epsilon_above_max_epsilon_is_refused_unless_the_limit_is_raised():
    with pytest.raises(ConfigurationError, match=r"privacy\.epsilon=1000 is above privacy\.max_epsilon=100"):
        plan_of("privacy.epsilon=1000")
    fixed = ("privacy.epsilon=null", "privacy.noise_multiplier=1.0", "max_steps=10")
    planned = plan_of(*fixed).plan.planned_epsilon
    below = f"privacy.max_epsilon={planned / 2}"
    with pytest.raises(ConfigurationError, match=r"above privacy\.max_epsilon=.*privacy\.max_epsilon=null"):
        plan_of(*fixed, below)
    assert plan_of(*fixed, f"privacy.max_epsilon={planned * 2}").plan.planned_epsilon == planned


def test_a_calibration_floor_hit_is_reported_in_the_log_and_results(tmp_path: Path):
    run = dpbench("privacy.epsilon=1000", "privacy.max_epsilon=null", "max_steps=2", "trainer.checkpoint=false",
                  f"hydra.run.dir={tmp_path}", *FAST)
    assert run.returncode == 0, run.stderr[-3000:]
    out = results(tmp_path)
    assert out["calibration_floor_hit"] is True and out["noise_multiplier"] == SIGMA_MIN
    assert out["planned_epsilon"] < 1000 and out["epsilon"] <= out["planned_epsilon"] * 1.01
    log = (tmp_path / "dpbench.log").read_text()
    assert "smallest noise multiplier" in log and f"{out['planned_epsilon']:.4g}" in log


def _planned_or_skip(*overrides: str):
    try:
        return plan_of(*overrides).plan
    except MissingDataError as error:
        pytest.skip(f"data not available offline: {error}")


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_shipped_experiment_plans_a_finite_sensible_epsilon(name):
    plan = _planned_or_skip(f"+experiment={name}")
    assert not plan.private or (math.isfinite(plan.planned_epsilon) and plan.planned_epsilon <= 100.0)
    assert not plan.floor_hit


@pytest.mark.slow
@pytest.mark.parametrize("sweep", JL_SWEEPS)
def test_every_jl_sweep_column_plans_a_finite_epsilon(sweep):
    config = OmegaConf.load(ROOT / "conf" / "sweep" / f"{sweep}.yaml")
    defaults = OmegaConf.to_container(config.defaults)
    experiment = next(entry["/experiment"] for entry in defaults if isinstance(entry, dict) and "/experiment" in entry)
    for privatizer in str(config.hydra.sweeper.params.privatizer).split(","):
        plan = _planned_or_skip(f"+experiment={experiment}", f"privatizer={privatizer}")
        assert not plan.private or (math.isfinite(plan.planned_epsilon) and plan.planned_epsilon <= 100.0)
