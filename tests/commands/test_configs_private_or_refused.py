"""Property test: any (epsilon, delta, batch, clip, strategy knobs) either runs privately or fails clearly.

Never a run that claims privacy it does not have: when a plan is made, its noise is positive and its composed
epsilon is within the target; the first privatized step is finite.
"""

import dataclasses
import math

import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from dpbench.core.config import PrivacyConfig
from dpbench.core.errors import ConfigurationError
from dpbench.core.optim import OptimizerConfig
from dpbench.core.tasks import ClassificationTask
from dpbench.privacy import PrivacyAccountant
from dpbench.privatizers import STRATEGIES, PrivacySettings, make_strategy
from dpbench.privatizers.base import StepContext
from dpbench.privatizers.privacy_plan import make_plan
from tests.helpers.tiny_task import tiny_batch, tiny_classifier

N = 400
def mostly(valid, hostile):
    """Valid values three times in four, so that most examples reach the plan and the first step."""
    return st.one_of(valid, valid, valid, hostile)


KNOBS = {  # strategy config keys and the hostile values to draw for them
    "projections": mostly(st.integers(1, 40), st.integers(-2, 0)),
    "rank": mostly(st.integers(1, 40), st.integers(-2, 0)),
    "dim": mostly(st.integers(1, 400), st.integers(-2, 0)),
    "update_every": mostly(st.integers(1, 5), st.integers(-1, 0)),
    "gamma": mostly(st.floats(1e-3, 1.0), st.floats(-1.0, 0.0)),
}
OPTIMIZERS = ["sgd", "adam"]
VALID_KNOBS = {
    "projections": st.integers(1, 40),
    "rank": st.integers(1, 40),
    "dim": st.integers(1, 400),
    "update_every": st.integers(1, 5),
    "gamma": st.floats(1e-3, 1.0),
}
# What a valid configuration may still be refused for, by design: a target no noise reaches, a fixed noise
# multiplier whose planned epsilon is past privacy.max_epsilon or infinite (JL with r=1 at a small delta), an
# optimizer the strategy does not drive.
VALID_REFUSALS = ("unreachable", "privacy.max_epsilon", "optimizer=", "privacy.allow_infinite_epsilon")
IMAGE_STRATEGIES = sorted(name for name in STRATEGIES if name != "sparse")


VALID = {
    "epsilon": st.floats(0.1, 50.0),
    "delta": st.floats(1e-9, 1e-2),
    "noise": st.one_of(st.none(), st.floats(0.3, 5.0)),
    "batch_size": st.integers(1, N),
    "clip": st.floats(1e-3, 10.0),
    "steps": st.integers(1, 60),
}
HOSTILE = {
    "epsilon": mostly(VALID["epsilon"], st.sampled_from([None, -1.0, 0.0, math.nan, math.inf, 1e-6])),
    "delta": mostly(VALID["delta"], st.sampled_from([-0.1, 0.0, 1.0, 1.2, math.nan])),
    "noise": mostly(VALID["noise"], st.sampled_from([0.0, -1.0, math.nan, 1e-3])),
    "batch_size": mostly(VALID["batch_size"], st.integers(-5, 2 * N)),
    "clip": mostly(VALID["clip"], st.sampled_from([0.0, -1.0, math.nan, math.inf])),
    "steps": mostly(VALID["steps"], st.integers(-1, 0)),
}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(IMAGE_STRATEGIES), data=st.data(), **HOSTILE)
def test_hostile_configurations_run_privately_or_fail_clearly(name, data, **params):
    check(name, data, hostile=True, **params)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(IMAGE_STRATEGIES), data=st.data(), **VALID)
def test_valid_configurations_plan_honestly_and_step(name, data, **params):
    check(name, data, hostile=False, **params)


def check(name, data, hostile, epsilon, delta, noise, batch_size, clip, steps):
    """Either a clear refusal, or a plan whose noise is positive and whose epsilon meets its target."""
    schema = STRATEGIES[name].schema
    defaults = {f.name: f.default for f in dataclasses.fields(schema)}
    knobs = {key: data.draw(values if hostile else VALID_KNOBS[key], label=key)
             for key, values in KNOBS.items() if key in defaults and (hostile or defaults[key] is not None)}
    try:
        if not 0 < batch_size <= N:
            raise ConfigurationError(f"batch_size {batch_size}")  # what run_experiment raises before planning
        rate = batch_size / N
        strategy = make_strategy(OmegaConf.create({"name": name, **knobs}), PrivacySettings(clip, rate, noise))
        model = tiny_classifier()  # the tiny_task fixture's model, built anew for each example
        config = PrivacyConfig(epsilon=epsilon, delta=delta, noise_multiplier=noise, clip_norm=clip,
                               accountant_eps_error=0.05)
        plan = make_plan(strategy, config, rate, steps, model)
        strategy.attach(model)
        optimizer = strategy.configure_optimizer(model, OptimizerConfig(name=data.draw(st.sampled_from(OPTIMIZERS)),
                                                                        lr=0.1))
    except (ConfigurationError, ValueError) as error:
        event(f"refused: {str(error)[:60]}")
        assert hostile or any(reason in str(error) for reason in VALID_REFUSALS), error
        return  # refused with an error: fine
    event(f"planned {name}")
    if plan.private:
        assert plan.noise_multiplier is not None and plan.noise_multiplier > 0
        spent = PrivacyAccountant(eps_error=0.05).epsilon(strategy.composition(plan.noise_multiplier, steps), delta)
        assert spent.epsilon > 0
        if plan.calibrated:
            assert spent.epsilon <= epsilon * 1.001
        assert math.isfinite(plan.planned_epsilon) or not plan.calibrated
    batch = tiny_batch(batch_size % 7 + 1)
    strategy.privatize(model, ClassificationTask(), batch, StepContext(0, float(batch_size)))
    strategy.apply_update(optimizer)
    assert all(torch.isfinite(p).all() for p in model.parameters())
