"""Sparse privatizer: selection distributions against references, SVT halting, noise and updates only on the
selected coordinates, the S1 and S2 bounds, the selected-coordinate Adam, resumable randomness."""

import math
from itertools import permutations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from dpbench.core.optim import OptimizerConfig
from dpbench.core.tasks import NegativeSamplingTask
from dpbench.models.word2vec import Word2Vec
from dpbench.privacy.mechanisms import SubsampledGaussian
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.base import StepContext
from dpbench.privatizers.coordinate_selection import exponential_top_k, sparse_vector, uniform_untouched
from tests.helpers.models import w2v_batch

pytestmark = pytest.mark.models_as_built

TASK = NegativeSamplingTask()


def test_exponential_selection_frequencies_match_sequential_probabilities():
    """k = 2 of p = 5: every unordered pair's frequency against Algorithm 4's sequential draw probabilities."""
    touched, utility, p = np.array([0, 2, 3]), np.array([1.5, 0.2, -0.7]), 5
    weights = np.ones(p)
    weights[touched] = np.exp(utility)
    exact: dict[tuple[int, int], float] = {}
    for first, second in permutations(range(p), 2):
        probability = weights[first] / weights.sum() * weights[second] / (weights.sum() - weights[first])
        key = tuple(sorted((first, second)))
        exact[key] = exact.get(key, 0.0) + probability
    rng = np.random.default_rng(0)
    draws = 20_000
    counts: dict[tuple[int, int], int] = {}
    for _ in range(draws):
        key = tuple(exponential_top_k(touched, utility, p, 2, rng).tolist())
        counts[key] = counts.get(key, 0) + 1
    for key, probability in exact.items():
        sd = math.sqrt(probability * (1 - probability) / draws)
        assert abs(counts.get(key, 0) / draws - probability) < 4.5 * sd + 1e-3, key


def test_exponential_selection_with_many_untouched_matches_a_dense_gumbel_reference():
    """The untouched part drawn from order statistics gives the same law as Gumbel top-k over all p coordinates."""
    touched, utility, p, k = np.array([5, 40, 41]), np.array([4.0, 3.0, 2.5]), 200, 3
    rng = np.random.default_rng(1)
    dense = np.zeros(p)
    dense[touched] = utility
    draws = 6000
    fast = np.zeros(len(touched))
    reference = np.zeros(len(touched))
    for _ in range(draws):
        fast += np.isin(touched, exponential_top_k(touched, utility, p, k, rng))
        reference += np.isin(touched, np.argsort(-(dense + rng.gumbel(size=p)))[:k])
    sd = np.sqrt(0.25 / draws) * math.sqrt(2)
    np.testing.assert_array_less(np.abs(fast - reference) / draws, 4.5 * sd)
    assert fast[0] / draws > 0.3  # the highest utility is picked far more often than k/p = 0.015


def test_uniform_untouched_is_uniform_and_avoids_touched():
    rng = np.random.default_rng(2)
    touched = np.array([1, 3, 4])
    counts = np.zeros(10)
    for _ in range(4000):
        chosen = uniform_untouched(touched, 10, 2, rng)
        assert len(set(chosen.tolist())) == 2 and not set(chosen.tolist()) & {1, 3, 4}
        counts[chosen] += 1
    free = counts[[0, 2, 5, 6, 7, 8, 9]] / 4000
    np.testing.assert_allclose(free, 2 / 7, atol=0.03)


def test_svt_halts_after_its_count():
    rng = np.random.default_rng(3)
    touched = np.array([2, 7])
    selected = sparse_vector(touched, np.array([0.1, 0.1]), 1000, 5, -1e6, 1e-3, 1e-3, rng)
    assert selected.tolist() == [0, 1, 2, 3, 4]  # everything passes: the first five, then it stops
    high = sparse_vector(touched, np.array([50.0, 0.0]), 1000, 5, 10.0, 1e-3, 1e-3, rng)
    assert high.tolist() == [2]  # only the touched coordinate above the threshold, fewer than the count


def _naive_svt(touched, score, p, count, threshold, t_scale, q_scale, rng):
    values = np.zeros(p)
    values[touched] = score
    selected, level = [], threshold + rng.laplace(scale=t_scale)
    for i in range(p):
        if values[i] + rng.laplace(scale=q_scale) >= level:
            selected.append(i)
            if len(selected) == count:
                break
            level = threshold + rng.laplace(scale=t_scale)
    return selected


def test_svt_matches_a_coordinate_by_coordinate_reference():
    touched, score, p = np.array([10, 11, 30]), np.array([3.0, 0.5, 2.0]), 60
    rng = np.random.default_rng(4)
    runs = 3000
    fast, naive = np.zeros(p), np.zeros(p)
    for _ in range(runs):
        fast[sparse_vector(touched, score, p, 3, 2.5, 0.5, 1.0, rng)] += 1
        naive[_naive_svt(touched, score, p, 3, 2.5, 0.5, 1.0, rng)] += 1
    assert np.abs(fast - naive).max() / runs < 0.04
    assert abs(fast.sum() - naive.sum()) / runs < 0.1


def sparse_strategy(selection="exponential", sigma=1.0, clip=1.0, sparsity=0.05, clip2=0.05, draw_epsilon=0.5,
                    lazy_adam=True):
    config = {"name": "sparse", "selection": selection, "sparsity": sparsity, "clip2": clip2,
              "draw_epsilon": draw_epsilon, "lazy_adam": lazy_adam}
    return make_strategy(OmegaConf.create(config), PrivacySettings(clip, 0.01, sigma, PrivacyRandomness(0)))


@pytest.mark.parametrize("selection", ["exponential", "svt", "random"])
def test_noise_and_updates_land_only_on_selected_coordinates(selection):
    torch.manual_seed(0)
    model = Word2Vec(200, 10)
    strategy = sparse_strategy(selection, sigma=2.0, sparsity=0.2)
    strategy.attach(model)
    optimizer = strategy.configure_optimizer(model, OptimizerConfig(name="sgd", lr=1.0))
    before = model.embedding.weight.detach().clone().reshape(-1)
    strategy.privatize(model, TASK, w2v_batch(200, 16), StepContext(0, 16.0))
    strategy.apply_update(optimizer)
    after = model.embedding.weight.detach().reshape(-1)
    chosen = strategy.last_selection["indices"]
    assert len(chosen) == strategy.draws == 400 or selection == "svt"
    changed = (after != before).nonzero().flatten()
    assert set(changed.tolist()) <= set(chosen.tolist())
    torch.testing.assert_close(after[chosen] - before[chosen], -strategy.last_selection["noisy"].float())
    noise = strategy.last_selection["noisy"] - strategy.last_selection["clipped"]
    expected_std = 2.0 * min(1.0 / 16.0, 2 * 0.05)
    assert abs(float(noise.std()) / expected_std - 1) < 0.15


def test_contributions_are_bounded_by_s1_and_s2():
    torch.manual_seed(0)
    model = Word2Vec(50, 8)
    inputs, targets = w2v_batch(50, 12)
    model.embedding.weight.data *= 30  # huge gradients: every sample is clipped
    s1, s2 = 0.3, 0.01
    strategy = sparse_strategy(clip=s1, clip2=s2, sparsity=1.0)
    strategy.attach(model)
    for i in range(12):  # one sample alone: its summed contribution has norm at most S1
        one = ({k: v[i : i + 1] for k, v in inputs.items()}, targets[i : i + 1])
        strategy.accumulate(model, TASK, one, None)
        _, summed = strategy._touched(1.0)
        assert float(summed.norm()) <= s1 * (1 + 1e-5)
        assert float(summed.norm()) > 0.9 * s1
    strategy.privatize(model, TASK, (inputs, targets), StepContext(0, 12.0))
    assert float(strategy.last_selection["clipped"].norm()) <= s2 * (1 + 1e-9)


def test_selected_coordinate_adam_matches_torch_adam_on_the_selected_coordinates():
    torch.manual_seed(0)
    model = Word2Vec(10, 3)
    reference = torch.nn.Parameter(model.embedding.weight.detach().reshape(-1)[[4, 7]].clone())
    adam = torch.optim.Adam([reference], lr=0.01)
    strategy = sparse_strategy()
    strategy.attach(model)
    optimizer = strategy.configure_optimizer(model, OptimizerConfig(name="adam", lr=0.01))
    untouched = model.embedding.weight.detach().reshape(-1)[0].item()
    for _ in range(5):
        grad = torch.randn(2)
        optimizer.step_coordinates({model.embedding.weight: (torch.tensor([4, 7]), grad)})
        reference.grad = grad.clone()
        adam.step()
    torch.testing.assert_close(model.embedding.weight.detach().reshape(-1)[[4, 7]], reference.detach())
    assert model.embedding.weight.detach().reshape(-1)[0].item() == untouched


def test_dense_adam_is_torch_adam_on_the_released_update_and_keeps_moving_earlier_selections():
    """lazy_adam=false (the paper's Opacus setup): torch's Adam on the noisy update, zero off the selection."""
    torch.manual_seed(0)
    model = Word2Vec(60, 5)
    reference = [p.detach().clone().requires_grad_() for p in model.parameters()]
    adam = torch.optim.Adam(reference, lr=0.05)
    strategy = sparse_strategy(sparsity=0.02, lazy_adam=False)
    strategy.attach(model)
    optimizer = strategy.configure_optimizer(model, OptimizerConfig(name="adam", lr=0.05))
    selections = []
    for step in range(3):
        strategy.privatize(model, TASK, w2v_batch(60, 8), StepContext(step, 8.0))
        released = torch.zeros(strategy.num_coordinates, dtype=torch.float64)
        released[strategy.last_selection["indices"]] = strategy.last_selection["noisy"]
        offset = 0
        for param in reference:
            param.grad = released[offset : offset + param.numel()].view_as(param).float()
            offset += param.numel()
        adam.step()
        strategy.apply_update(optimizer)
        selections.append(set(strategy.last_selection["indices"].tolist()))
        for param, expected in zip(model.parameters(), reference, strict=True):
            torch.testing.assert_close(param.detach(), expected.detach())
    before = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    strategy.privatize(model, TASK, w2v_batch(60, 8), StepContext(3, 8.0))
    strategy.apply_update(optimizer)
    after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    moved = set((after != before).nonzero().flatten().tolist())
    earlier_only = set().union(*selections) - set(strategy.last_selection["indices"].tolist())
    assert earlier_only and earlier_only <= moved  # momentum from earlier selections, no new privacy cost


def test_random_selection_is_a_plain_subsampled_gaussian():
    strategy = sparse_strategy("random", sigma=1.3)
    strategy.attach(Word2Vec(20, 4))
    assert strategy.step_mechanisms(0) == [SubsampledGaussian(0.01, 1.3)]


def test_selection_and_noise_resume_from_state():
    torch.manual_seed(0)
    model = Word2Vec(100, 6)
    batch = w2v_batch(100, 8)
    strategy = sparse_strategy()
    strategy.attach(model)
    strategy.privatize(model, TASK, batch, StepContext(0, 8.0))
    state = strategy.state_dict()
    strategy.privatize(model, TASK, batch, StepContext(1, 8.0))
    expected = strategy.last_selection
    strategy.load_state_dict(state)
    global_state = torch.random.get_rng_state()
    strategy.privatize(model, TASK, batch, StepContext(1, 8.0))
    assert torch.equal(strategy.last_selection["indices"], expected["indices"])
    assert torch.equal(strategy.last_selection["noisy"], expected["noisy"])
    assert torch.equal(torch.random.get_rng_state(), global_state)  # the global RNG is never used


def test_the_update_goes_through_optimizer_step_so_lightning_counts_it():
    class Wrapped:  # how Lightning's LightningOptimizer presents the optimizer: .optimizer and a counted step()
        def __init__(self, inner):
            self.optimizer, self.calls = inner, 0

        def step(self):
            self.calls += 1
            self.optimizer.step()

    torch.manual_seed(0)
    model = Word2Vec(100, 6)
    strategy = sparse_strategy()
    strategy.attach(model)
    wrapped = Wrapped(strategy.configure_optimizer(model, OptimizerConfig(name="adam", lr=0.1)))
    before = model.embedding.weight.detach().clone()
    strategy.privatize(model, TASK, w2v_batch(100, 8), StepContext(0, 8.0))
    strategy.apply_update(wrapped)
    assert wrapped.calls == 1
    assert (model.embedding.weight != before).sum() == strategy.draws
