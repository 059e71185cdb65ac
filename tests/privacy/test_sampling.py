"""Poisson sampling: rate, independence across samples, epoch length, empty batches; shuffled batches.

The samplers called by hand here; tests/privacy/test_fresh_batches.py checks the same properties through a real Trainer.
"""

import pytest
import torch

from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privacy.sampling import PoissonBatchSampler, ShuffledBatchSampler


def test_poisson_batch_sizes_have_mean_qn_and_binomial_variance():
    n, q = 2000, 0.05
    sampler = PoissonBatchSampler(n, q, PrivacyRandomness(3))
    sizes = torch.tensor([len(sampler.batch(step)) for step in range(400)], dtype=torch.float64)
    assert len(sampler) == 20
    assert float(sizes.mean()) == pytest.approx(n * q, rel=0.03)
    assert float(sizes.var()) == pytest.approx(n * q * (1 - q), rel=0.2)


def test_each_sample_is_included_at_rate_q():
    n, q = 50, 0.2
    counts = torch.zeros(n)
    sampler = PoissonBatchSampler(n, q, PrivacyRandomness(0), steps_per_epoch=4000)
    for batch in sampler:
        counts[batch] += 1
    assert torch.allclose(counts / 4000, torch.full((n,), q), atol=0.03)


def test_batches_are_keyed_by_the_step_where_the_epoch_starts():
    step = {"done": 0}
    sampler = PoissonBatchSampler(20, 0.01, PrivacyRandomness(1), first_step=lambda: step["done"])
    batches = list(sampler)
    assert any(len(b) == 0 for b in batches)
    assert batches == list(sampler)  # a restart at the same step redraws the same batches: no extra release
    step["done"] = len(sampler)
    assert batches != list(sampler)
    assert list(sampler)[0] == sampler.batch(len(sampler))


def test_the_privacy_seed_and_nothing_else_keys_the_batches():
    def epoch(seed):
        return list(PoissonBatchSampler(500, 0.1, PrivacyRandomness(seed)))

    assert epoch(4) == epoch(4)
    assert epoch(4) != epoch(5)
    assert epoch(None) != epoch(None)  # null: a fresh secret root from the OS


def test_shuffled_batches_are_fixed_size_permutations_fresh_each_epoch():
    step = {"done": 0}
    sampler = ShuffledBatchSampler(103, 10, PrivacyRandomness(0), first_step=lambda: step["done"])
    batches = list(sampler)
    assert len(batches) == 10 and all(len(b) == 10 for b in batches)
    assert len({i for b in batches for i in b}) == 100
    step["done"] = 10
    assert list(sampler) != batches
    step["done"] = 13  # resumed mid-epoch: the rest of the epoch's permutation
    assert list(sampler) == list(ShuffledBatchSampler(103, 10, PrivacyRandomness(0), lambda: 10))[3:]
