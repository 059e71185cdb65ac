"""Ghost norms of tokens whose terms cancel (sites.py, norms.py; an embedding's repeated token at the end): a record of
two tokens +big u and -big u + v has a small gradient, but its ghost norm is a difference of ~big^2 terms. Its float32
ghost norm was a tenth of the true one, so its clipped contribution reached 1.8 C. Such samples are now clipped and
summed from their gradients materialized in float64: every contribution stays within C, through the engine and
through a real Trainer."""

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from dpbench.core.optim import OptimizerConfig
from dpbench.core.tasks import ClassificationTask
from dpbench.data import DataBundle, TensorSplit
from dpbench.privacy.accountant import PrivacyAccountant
from dpbench.privacy.ledger import PrivacyLedger
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privatizers import PrivacySettings, StepContext, make_strategy
from dpbench.privatizers.per_sample import HookEngine
from dpbench.training.datamodule import DPDataModule
from dpbench.training.module import DPModule

pytestmark = pytest.mark.models_as_built

TASK, FEATURES, CLIP = ClassificationTask(), 16, 1.0


class MeanPool(nn.Module):
    """Tokens -> Linear -> mean over tokens -> Linear: the first layer's ghost norm reads the raw tokens."""

    def __init__(self):
        super().__init__()
        self.fc, self.head = nn.Linear(FEATURES, 16), nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.fc(x).mean(1))


class SharedInput(nn.Module):
    """Three layers read the same tokens, as an attention block's query, key and value do: one shared Gram."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(FEATURES, 16) for _ in range(3))
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head((self.q(x) + torch.tanh(self.k(x)) + self.v(x)).mean(1))


def cancelling(count: int, big: float, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    u, v = torch.randn(count, FEATURES, generator=generator), 20 * torch.randn(count, FEATURES, generator=generator)
    return torch.stack([big * u, -big * u + v], dim=1)


def contributions(engine: HookEngine, batch) -> torch.Tensor:
    sites, factors, _, _ = engine.clipped_sites(TASK, batch, CLIP)
    return each_contribution(sites, factors)


def each_contribution(sites, factors: torch.Tensor) -> torch.Tensor:
    """Each sample's clipped contribution as the step sums it: the same sites, its factor alone."""
    alone = []
    for i in range(factors.shape[0]):
        one = torch.zeros_like(factors).index_fill(0, torch.tensor([i]), 1) * factors
        alone.append(torch.sqrt(sum(site.weighted_sum(one).double().pow(2).sum()
                                    for group in sites.values() for site in group)))
    return torch.stack(alone)


def exact_norms(model: nn.Module, batch) -> torch.Tensor:
    """Per-example gradient norms of a float64 copy on the same (float32) inputs."""
    copy = type(model)().double()
    copy.load_state_dict(model.state_dict())
    norms = []
    for x, y in zip(*batch, strict=True):
        inputs = x[None].double() if x.is_floating_point() else x[None]
        grads = torch.autograd.grad(TASK.per_sample_loss(copy, (inputs, y[None])).sum(),
                                    [p for p in copy.parameters() if p.requires_grad])
        norms.append(torch.sqrt(sum(g.pow(2).sum() for g in grads)))
    return torch.stack(norms)


@pytest.mark.parametrize("big", [1e5, 1e9])
@pytest.mark.parametrize("build", [MeanPool, SharedInput])
def test_each_contribution_of_cancelling_tokens_is_within_the_clip_norm(build, big):
    torch.manual_seed(0)
    model = build()
    x = cancelling(12, big)
    batch = (x, torch.randint(0, 3, (12,), generator=torch.Generator().manual_seed(1)))
    engine = HookEngine(model)  # used directly, it checks its first batch only: an ordinary one
    engine.clipped_sum(TASK, (torch.randn(12, 2, FEATURES), batch[1]), CLIP)
    assert bool((contributions(engine, batch) <= CLIP * (1 + 1e-5)).all())
    if big == 1e5:  # the norms are the gradients' (at 1e9 float32 tokens lose v, and the model computes otherwise)
        norms = engine.clipped_sum(TASK, batch, CLIP).norms  # float32 activations: within 1%, not 10x as before
        torch.testing.assert_close(norms.double(), exact_norms(model, batch), rtol=1e-2, atol=0)


def test_well_conditioned_samples_keep_the_ghost_path():
    torch.manual_seed(0)
    model = SharedInput()
    engine = HookEngine(model)
    sites, _, _, _ = engine.clipped_sites(TASK, (torch.randn(16, 5, FEATURES), torch.randint(0, 3, (16,))), CLIP)
    assert all(getattr(site, "exact", None) is None for group in sites.values() for site in group)


def repeated_tokens(size: int, seed: int) -> torch.Tensor:
    """Records of one token twice (RepeatedToken's cancelling case)."""
    return torch.randint(0, 10, (size, 1), generator=torch.Generator().manual_seed(seed)).repeat(1, 2)


@pytest.mark.parametrize("case", ["tokens", "repeated token"])
def test_cancelling_records_stay_within_the_clip_norm_through_a_real_trainer(case, monkeypatch):
    """Every record of the data cancels (at 1e4, where float32 per-example passes still pass the engine's checks);
    each step's sites, the ones the step sums, give every sample's contribution, over Poisson batches of several
    epochs."""
    size, batch_size = 256, 16
    x = cancelling(size, 1e4, seed=3) if case == "tokens" else repeated_tokens(size, seed=3)
    targets = torch.randint(0, 3, (size,), generator=torch.Generator().manual_seed(4))
    bundle = DataBundle("cancelling", TensorSplit(x, targets), TensorSplit(x[:32], targets[:32]), num_classes=3)
    randomness = PrivacyRandomness(5)
    strategy = make_strategy(OmegaConf.create({"name": "vanilla", "engine": "hooks"}),
                             PrivacySettings(CLIP, batch_size / size, 1.0, randomness))
    torch.manual_seed(0)
    model = MeanPool() if case == "tokens" else RepeatedToken(big=1e4)
    strategy.prepare(model, 40, 1e-5, None, PrivacyAccountant())
    seen = []
    clipped_sites = HookEngine.clipped_sites

    def spying(engine, task, batch, clip_norm, *args):
        result = clipped_sites(engine, task, batch, clip_norm, *args)
        seen.extend(each_contribution(result[0], result[1]).tolist())
        return result

    monkeypatch.setattr(HookEngine, "clipped_sites", spying)
    module = DPModule(model, bundle.task, strategy, OptimizerConfig(name="sgd", lr=0.05), PrivacyLedger(1e-5),
                      float(batch_size), train_stats=False)
    trainer = L.Trainer(accelerator="cpu", max_epochs=-1, max_steps=40, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_val_batches=0, use_distributed_sampler=False)
    trainer.fit(module, datamodule=DPDataModule(bundle, batch_size, "poisson", randomness, eval_batch_size=64))
    assert module.ledger.steps == 40 and len(seen) > 400
    assert max(seen) <= CLIP * (1 + 1e-5)


class RepeatedToken(nn.Module):
    """Token ids -> Embedding -> both positions side by side -> a frozen head whose two position blocks are big u and
    -big u + v: a record repeating one token gets output gradients at its two positions that nearly cancel."""

    def __init__(self, big: float = 1e5, vocabulary: int = 10, width: int = 8):
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, width)
        self.head = nn.Linear(2 * width, 3)
        generator = torch.Generator().manual_seed(2)
        u, v = torch.randn(3, width, generator=generator), torch.randn(3, width, generator=generator)
        with torch.no_grad():
            self.head.weight.copy_(torch.cat([big * u, -big * u + v], dim=1))
        self.head.requires_grad_(False)

    def forward(self, ids):
        return self.head(self.embedding(ids).flatten(1))


@pytest.mark.parametrize("privatizer", ["vanilla", "sparse"])
def test_a_repeated_token_whose_gradients_cancel_stays_within_the_clip_norm(privatizer):
    torch.manual_seed(0)
    model = RepeatedToken()
    ids = torch.arange(10).repeat_interleave(2).view(10, 2)  # each record repeats one token
    batch = (ids, torch.randint(0, 3, (10,), generator=torch.Generator().manual_seed(3)))
    engine = HookEngine(model)
    engine.clipped_sum(TASK, (torch.randint(0, 10, (10, 2)), batch[1]), CLIP)  # its one check, on ordinary records
    assert bool((contributions(engine, batch) <= CLIP * (1 + 1e-5)).all())
    norms = engine.clipped_sum(TASK, batch, CLIP).norms
    # the float32 logits cancel too, so the model's own gradients are a percent from float64's (the Gram gave 0)
    torch.testing.assert_close(norms.double(), exact_norms(model, batch), rtol=5e-2, atol=1e-6)
    if privatizer == "sparse":  # sparse sums the rows itself
        strategy = make_strategy(OmegaConf.create({"name": "sparse", "selection": "random"}),
                                 PrivacySettings(CLIP, 0.1, 0.0, PrivacyRandomness(0)))
        strategy.attach(model)
        for i in range(10):
            strategy.accumulate(model, TASK, (ids[i:i + 1], batch[1][i:i + 1]), StepContext(0, 1.0))
            _, values = strategy._touched(1.0)
            assert float(values.norm()) <= CLIP * (1 + 1e-5)
