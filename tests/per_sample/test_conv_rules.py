"""Both per-sample convolution rules against a per-example loop in float64, and the timing choice between them."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from dpbench.privatizers.per_sample import fastest
from dpbench.privatizers.per_sample.layers import conv_sites, grouped_conv_sites, patch_conv_sites

LAYERS = {
    "conv1d_stride_padding": (lambda: nn.Conv1d(2, 4, 3, stride=2, padding=1), (2, 9)),
    "conv1d_dilation_groups": (lambda: nn.Conv1d(4, 6, 3, dilation=2, groups=2), (4, 11)),
    "conv1d_circular": (lambda: nn.Conv1d(2, 3, 3, padding=1, padding_mode="circular"), (2, 7)),
    "conv2d_tf_privacy_first": (lambda: nn.Conv2d(1, 16, 8, stride=2, padding=3), (1, 28, 28)),
    "conv2d_groups": (lambda: nn.Conv2d(4, 6, 3, groups=2, padding=1), (4, 5, 5)),
    "conv2d_depthwise_no_bias": (lambda: nn.Conv2d(4, 4, 3, groups=4, bias=False), (4, 5, 5)),
    "conv2d_same_dilated": (lambda: nn.Conv2d(2, 3, (2, 3), padding="same", dilation=(1, 2)), (2, 6, 6)),
    "conv2d_reflect_stride": (lambda: nn.Conv2d(2, 3, 3, stride=2, padding=1, padding_mode="reflect"), (2, 7, 7)),
}
BATCH = 5


def per_example(layer: nn.Module, x: torch.Tensor, weights: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Each sample's gradient of <weights_i, layer(x_i)> by its own backward pass."""
    grads: dict[nn.Parameter, list[torch.Tensor]] = {p: [] for p in layer.parameters()}
    for i in range(x.shape[0]):
        out = layer(x[i : i + 1])
        found = torch.autograd.grad((out * weights[i : i + 1]).sum(), list(layer.parameters()))
        for p, grad in zip(layer.parameters(), found, strict=True):
            grads[p].append(grad)
    return {p: torch.stack(found) for p, found in grads.items()}


@pytest.mark.parametrize("rule", [patch_conv_sites, grouped_conv_sites], ids=["patches", "grouped"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_each_rule_gives_every_sample_its_own_gradient(name, rule):
    make, shape = LAYERS[name]
    torch.manual_seed(0)
    layer = make().double()
    x = torch.randn(BATCH, *shape, dtype=torch.float64)
    g = torch.randn_like(layer(x))  # the output gradient of the loss sum_i <g_i, layer(x_i)>
    expected = per_example(layer, x, g)
    factors = torch.rand(BATCH, dtype=torch.float64)
    for dense in (False, True):
        sites = rule(layer, x, g, dense)
        assert set(sites) == set(layer.parameters())
        for param, site in sites.items():
            reference = expected[param]
            torch.testing.assert_close(site.materialize().reshape(reference.shape), reference)
            torch.testing.assert_close(site.norm_sq(), reference.flatten(1).pow(2).sum(1))
            torch.testing.assert_close(site.weighted_sum(factors), torch.einsum("b,b...->...", factors, reference))


def test_a_huge_sample_is_still_clipped_to_the_bound_by_the_grouped_rule():
    torch.manual_seed(0)
    layer = nn.Conv2d(1, 16, 8, stride=2, padding=3).double()
    x = torch.randn(4, 1, 28, 28, dtype=torch.float64)
    x[2] *= 1e6
    g = torch.randn_like(layer(x))
    sites = grouped_conv_sites(layer, x, g, False)
    norms = sum(site.norm_sq() for site in sites.values()).sqrt()
    factors = (1.0 / norms).clamp(max=1.0)
    expected = per_example(layer, x, g)
    for i in range(4):  # each sample's clipped contribution alone
        alone = torch.zeros(4, dtype=torch.float64)
        alone[i] = factors[i]
        contribution = torch.cat([site.weighted_sum(alone).flatten() for site in sites.values()])
        reference = torch.cat([factors[i] * expected[p][i].flatten() for p in sites])
        torch.testing.assert_close(contribution, reference)
        assert contribution.norm() <= 1.0 + 1e-9


@pytest.fixture(autouse=True)
def fresh_choices(tmp_path, monkeypatch):
    """No choice recorded by an earlier run: an empty cache directory, and none in this process."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fastest.forget()
    yield tmp_path / "cache"
    fastest.forget()


def test_the_faster_candidate_is_chosen_once_and_recorded_for_later_runs():
    calls = {"slow": 0, "quick": 0}

    def slow() -> None:
        calls["slow"] += 1
        time.sleep(0.01)

    def quick() -> None:
        calls["quick"] += 1

    cpu = torch.device("cpu")
    assert fastest.fastest("k", {"slow": slow, "quick": quick}, cpu) == "quick"
    assert calls == {"slow": fastest.TIMED_RUNS + 1, "quick": fastest.TIMED_RUNS + 1}
    assert fastest.fastest("k", {"slow": slow, "quick": quick}, cpu) == "quick"
    fastest.forget()  # a later process: it reads the choice instead of timing again
    assert fastest.fastest("k", {"slow": slow, "quick": quick}, cpu) == "quick"
    assert calls == {"slow": fastest.TIMED_RUNS + 1, "quick": fastest.TIMED_RUNS + 1}
    assert fastest.fastest("single", {"slow": slow}, cpu) == "slow"
    assert not any("single" in key for key in fastest.chosen())


def test_a_near_tie_keeps_the_first_candidate(monkeypatch):
    """Noise must not flip a choice: the second wins only by the margin."""
    timings = iter([1.0, 1.0 - fastest.MARGIN / 2, 1.0, 1.0 - 2 * fastest.MARGIN])
    monkeypatch.setattr(fastest, "_seconds", lambda run, device: next(timings))
    cpu = torch.device("cpu")
    assert fastest.fastest("tie", {"first": print, "second": print}, cpu) == "first"
    assert fastest.fastest("clear", {"first": print, "second": print}, cpu) == "second"


def test_poisson_batches_around_the_expected_size_share_a_choice():
    assert fastest.batch_bucket(250) == fastest.batch_bucket(256) == 256
    assert fastest.batch_bucket(257) == 512 and fastest.batch_bucket(1) == 1


@pytest.mark.parametrize("winner", ["patches", "grouped"])
def test_conv_sites_runs_the_rule_that_was_timed_fastest(monkeypatch, winner):
    """Whichever rule wins the timing, the sites are the sample's own gradients (float64, per-example loop)."""
    timings = iter([1.0, 2.0] if winner == "patches" else [2.0, 1.0])
    monkeypatch.setattr(fastest, "_seconds", lambda run, device: next(timings))
    layer = nn.Conv2d(2, 3, 3, padding=1).double()
    x = torch.randn(BATCH, 2, 6, 6, dtype=torch.float64)
    g = torch.randn_like(layer(x))
    sites = conv_sites(layer, x, g, False)
    assert list(fastest.chosen().values()) == [winner]
    expected = per_example(layer, x, g)
    for param, site in sites.items():
        torch.testing.assert_close(site.materialize().reshape(expected[param].shape), expected[param])


def test_the_grouped_rule_is_not_a_candidate_where_it_would_hold_much_more_memory(monkeypatch):
    """A wide layer over few positions: materializing (B, out, in, k, k) would dwarf the patch matrix."""
    seen = []
    monkeypatch.setattr(fastest, "fastest", lambda key, candidates, device: seen.append(set(candidates)) or "patches")
    monkeypatch.setattr("dpbench.privatizers.per_sample.layers.fastest", fastest.fastest)
    layer = nn.Conv2d(8, 64, 3)
    x = torch.randn(4, 8, 4, 4)
    conv_sites(layer, x, torch.randn_like(layer(x)), False)  # 4 positions, 64 output channels
    assert seen == [{"patches"}]


def test_concurrent_first_runs_keep_the_first_choice_written(fresh_choices):
    """Two runs that timed the same new shape at once: the one that records second takes the first's choice, so
    every later run (a resume, a rerun) computes with the same rule."""
    assert fastest._record("shape", "grouped") == "grouped"
    assert fastest._record("shape", "patches") == "grouped"
    assert (fresh_choices / "dpbench" / "rule_choices" / fastest.FILE).stat().st_mode & 0o077 == 0
