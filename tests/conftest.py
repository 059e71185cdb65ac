import os

import pytest
import torch
from hypothesis import Phase, settings

from dpbench.app import hydra_setup
from dpbench.app.hydra_setup import setup as setup_hydra

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ["WANDB_MODE"] = "disabled"
# submitit's import binds its log handlers to the sys.stdout/sys.stderr of that moment, a test's captured streams,
# which pytest closes: a later test's submitit warning then failed with "I/O operation on closed file".
os.environ.setdefault("SUBMITIT_LOG_LEVEL", "NOCONFIG")
# Under pytest-xdist every core already runs a worker: a worker (and the runs it starts) on one thread does not fight
# the others for cores (13% faster on 2 cores, test_resume and test_cli, 2026-11-27).
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# Hydra's config store holds the schemas and every plugin's config group, as a run's does (tests compose configs
# with the `compose` fixture, and a few with hydra.compose directly).
setup_hydra()

# CI replays the same property-test examples every run (a failure reproduces locally with
# HYPOTHESIS_PROFILE=ci) and reports the first failing example unshrunk: shrinking once took five minutes of CI.
settings.register_profile("ci", derandomize=True, phases=[Phase.explicit, Phase.reuse, Phase.generate])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True)
def _models_as_built(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests marked `models_as_built` test the per-sample rules and the sampled checks on hand-written models that
    stand for built-ins with those layers: in this process (not in CLI subprocesses) every model counts as built by
    dpbench, so the batch-level engines serve it as they would a built-in (per_sample/construction.py)."""
    if request.node.get_closest_marker("models_as_built") is None:
        return
    from dpbench.models import provenance
    from dpbench.privatizers.per_sample import construction

    monkeypatch.setattr(construction, "built_structure", provenance.structure)


@pytest.fixture
def compose():
    """dpbench.app.hydra_setup.compose: `compose(overrides, config_name="config")` is the config that
    `python -m dpbench OVERRIDES` composes (dpbench's conf dir, the schemas, every plugin's config group), the one
    code path the library composes through. Module-level helpers that compose call that function directly."""
    return hydra_setup.compose


@pytest.fixture
def tiny_task():
    """A small image classifier, its ClassificationTask and a batch of 6 (tests/helpers/tiny_task.py), the same in
    every test: for tests of a privatized step that need some model, not a particular one. Building the model seeds
    torch's global generator with 0."""
    from tests.helpers.tiny_task import tiny_task as build_tiny_task

    return build_tiny_task()


@pytest.fixture
def small_fashion_mnist(tmp_path):
    """512 training and 256 test images of the real Fashion-MNIST in the Debian package's layout, under tmp_path;
    skips the test when dataset-fashion-mnist is not installed (tests/helpers/fashion_mnist.py)."""
    from tests.helpers.fashion_mnist import small_fashion_mnist as fashion_mnist_subset

    return fashion_mnist_subset(tmp_path / "fashion-mnist")


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's tests: small models and FFTs run faster on one than on two busy cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
