"""Issue 14, finding 2: the secret randomness (noise, sampling, selection, ...) is independent of everything the run
publishes, its public seed included, and privacy.secure_rng reaches every secret draw."""

import numpy as np
import pytest
import torch

import dpbench.privacy.randomness as randomness_module
from dpbench.app import hydra_setup
from dpbench.core.errors import ConfigurationError
from dpbench.data import load_data
from dpbench.models import build_model
from dpbench.privacy.randomness import STREAMS, PrivacyRandomness, PrivateStream
from tests.helpers.cli import FAST, dpbench, final_weights
from tests.helpers.trainer_run import fit, index_data

pytestmark = pytest.mark.models_as_built

SIGMA, LR, BATCH = 1000.0, 1.0, 500  # noise dominates the update: (theta_0 - theta_1) * B / lr ~ N(0, (sigma C)^2)


def initial_weights(seed: int) -> tuple[torch.Tensor, list[torch.Size]]:
    """theta_0 as anyone can rebuild it from the published config (seed_everything, then the model)."""
    import lightning as L

    cfg = hydra_setup.compose([f"seed={seed}"])
    L.seed_everything(seed, verbose=False)
    model = build_model(cfg.model, load_data(cfg.data))
    params = [p.detach() for p in model.parameters()]
    return torch.cat([p.flatten() for p in params]), [p.shape for p in params]


def test_initial_weights_and_the_published_seed_do_not_predict_the_noise(tmp_path):
    run = dpbench("max_steps=1", f"batch_size={BATCH}", f"privacy.noise_multiplier={SIGMA}", f"optimizer.lr={LR}",
                  "privacy.epsilon=null", f"hydra.run.dir={tmp_path}", *FAST)
    assert run.returncode == 0, run.stderr[-3000:]
    theta0, shapes = initial_weights(0)
    theta1 = final_weights(tmp_path)
    released = (theta0 - theta1) * BATCH / LR
    assert float(released.std()) == pytest.approx(SIGMA, rel=0.05)  # the step did release noise of that scale
    # the attack of the review: a generator seeded with the published seed (the stream the initial weights came from)
    generator = torch.Generator().manual_seed(0)
    predicted = torch.cat([torch.randn(shape, generator=generator).flatten() for shape in shapes]) * SIGMA
    correlation = float(torch.corrcoef(torch.stack([released, predicted]))[0, 1])
    assert abs(correlation) < 0.05
    assert float(torch.corrcoef(torch.stack([released, theta0]))[0, 1]) ** 2 < 0.01


def test_secure_rng_reaches_sampling_noise_and_selection_through_a_trainer(monkeypatch):
    used: list[tuple[str, bool]] = []
    streams = {number: name for name, number in randomness_module.STREAMS.items()}
    keyed_init = randomness_module.KeyedDraws.__init__
    numpy_generator = randomness_module.PrivacyRandomness.numpy_generator

    def spy_draws(self, randomness, key, device):
        used.append((streams[key[1]], randomness.secure))
        keyed_init(self, randomness, key, device)

    def spy_numpy(self, stream, *indices):
        used.append((stream, self.secure))
        return numpy_generator(self, stream, *indices)

    monkeypatch.setattr(randomness_module.KeyedDraws, "__init__", spy_draws)
    monkeypatch.setattr(randomness_module.PrivacyRandomness, "numpy_generator", spy_numpy)
    fit(index_data(200), 20, 12, PrivacyRandomness(secure=True), privatizer={"name": "sparse", "selection": "random"})
    assert {"sampling", "noise", "selection"} <= {stream for stream, _ in used}
    assert all(secure for _, secure in used)


def test_the_noise_stream_resumes_where_it_stopped_and_never_replays_on_another_device():
    stream = PrivateStream(PrivacyRandomness(5), "noise")
    first = stream.normal_like(torch.zeros(100))
    saved = stream.state_dict()
    continued = stream.normal_like(torch.zeros(100))
    resumed = PrivateStream(PrivacyRandomness(5), "noise")
    resumed.load_state_dict(saved)
    assert torch.equal(resumed.normal_like(torch.zeros(100)), continued)
    # a checkpoint whose device is gone (a CUDA run resumed without a GPU): a new segment, not the start again
    moved = PrivateStream(PrivacyRandomness(5), "noise")
    moved.load_state_dict({**saved, "draws": {**saved["draws"], "device": "cuda:7"}})
    after = moved.normal_like(torch.zeros(100))
    assert moved.segment == saved["segment"] + 1
    assert not torch.equal(after, first) and not torch.equal(after, continued)


def test_a_resume_with_another_explicit_privacy_seed_or_secure_rng_is_refused():
    state = PrivacyRandomness(5).state_dict()
    PrivacyRandomness().load_state_dict(state)  # a secret seed takes the checkpoint's
    with pytest.raises(ConfigurationError, match="privacy.seed differs"):
        PrivacyRandomness(6).load_state_dict(state)
    with pytest.raises(ConfigurationError, match="secure_rng"):
        PrivacyRandomness(5, secure=True).load_state_dict(state)


def test_keys_whose_32_bit_seeds_collide_still_draw_different_noise():
    """torch's CPU generator keeps 32 bits of its seed, so the host noise had 2^32 possible streams, which a released
    gradient lets anyone search (a review: about a day on one core). Among a few tens of thousands of keys two share
    those 32 bits (a birthday collision); their host draws must still differ, as 128-bit Philox keys make them."""
    root, seen, pair = 2026, {}, None
    for index in range(300_000):
        low = int(np.random.SeedSequence([root, STREAMS["noise"], index]).generate_state(2)[1])
        if low in seen:
            pair = (seen[low], index)
            break
        seen[low] = index
    assert pair is not None
    randomness = PrivacyRandomness(root)
    first, second = (randomness.draws("noise", index).normal((256,)) for index in pair)
    assert not torch.equal(first, second)
    assert not torch.equal(*(randomness.draws("noise", index).permutation(1000) for index in pair))


def test_host_draws_are_the_same_on_any_number_of_cores(monkeypatch):
    """A large draw is split over the cores in fixed blocks: GRAPE's and D2P2's matrices and JL's directions must not
    change with the machine a run (or its resume) lands on."""
    drawn = []
    for cores in (1, 2, 3):
        monkeypatch.setattr(randomness_module.os, "cpu_count", lambda cores=cores: cores)
        drawn.append(PrivacyRandomness(11).draws("jl", 0).normal((3 * randomness_module.PARALLEL_DRAWS + 5,)))
    assert all(torch.equal(drawn[0], other) for other in drawn[1:])
