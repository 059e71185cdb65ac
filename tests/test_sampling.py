"""Poisson sampling: rate, independence across samples, epoch length, empty batches; shuffled batches."""

import pytest
import torch

from dpbench.privacy.sampling import PoissonBatchSampler, ShuffledBatchSampler


def test_poisson_batch_sizes_have_mean_qn_and_binomial_variance():
    n, q = 2000, 0.05
    sizes = []
    for epoch in range(20):
        sampler = PoissonBatchSampler(n, q, seed=3)
        sampler.set_epoch(epoch)
        sizes += [len(batch) for batch in sampler]
    sizes = torch.tensor(sizes, dtype=torch.float64)
    assert len(sampler) == 20
    assert float(sizes.mean()) == pytest.approx(n * q, rel=0.03)
    assert float(sizes.var()) == pytest.approx(n * q * (1 - q), rel=0.2)


def test_each_sample_is_included_at_rate_q():
    n, q = 50, 0.2
    counts = torch.zeros(n)
    sampler = PoissonBatchSampler(n, q, seed=0, steps_per_epoch=4000)
    for batch in sampler:
        counts[batch] += 1
    assert torch.allclose(counts / 4000, torch.full((n,), q), atol=0.03)


def test_small_rates_give_empty_batches_and_epochs_are_reproducible():
    sampler = PoissonBatchSampler(20, 0.01, seed=1)
    batches = list(sampler)
    assert any(len(b) == 0 for b in batches)
    assert batches == list(sampler)
    sampler.set_epoch(1)
    assert batches != list(sampler)


def test_shuffled_batches_are_fixed_size_permutations():
    sampler = ShuffledBatchSampler(103, 10, seed=0)
    batches = list(sampler)
    assert len(batches) == 10 and all(len(b) == 10 for b in batches)
    assert len({i for b in batches for i in b}) == 100
