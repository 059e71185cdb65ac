"""Exact by construction: natural user models that mix samples after step 0, test the batch's size, change a
parameter in their forward, or make one record's backward NaN cannot make a released step leak. Each is measured as
the add-one change of the released pre-noise sum (same privacy seed, one extra record, times the expected batch)
against C, through `make_private` and through a CLI run with the user model."""

import copy
import json
import math
import os
import stat
import subprocess
import sys

import pytest
import torch
from torch import nn

import dpbench
from dpbench.core.errors import UnsupportedModelError
from dpbench.models.provenance import built_by_dpbench
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privatizers.per_sample.construction import fast_path_refusal
from tests.helpers.cli import FAST, ROOT, final_weights
from tests.helpers.cli import dpbench as run_cli
from tests.helpers.construction_models import (
    FEATURES,
    FlipMix,
    OutlierCentring,
    ParityScaled,
    RunningScale,
    SelfNormalisingLinear,
    SqrtFeatures,
    TokenEmbedding,
    WarmupMixup,
)

SIZE, BATCH, CLIP = 256, 16, 1.0


def _dataset() -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(SIZE, FEATURES, generator=generator)
    return torch.utils.data.TensorDataset(features, (features[:, 0] > 0).long())


SMALL_MODEL_SETTINGS = {"grape": {"rank": 2}, "dp_galore": {"rank": 2}, "d2p2": {"dim": 4}}
"""What makes each method itself on these small models (the defaults would project nothing, and are refused)."""


def _private(model: nn.Module, privatizer, seed: int = 3, **kwargs) -> dpbench.PrivateTraining:
    loader = dpbench.poisson_loader(_dataset(), BATCH, PrivacyRandomness(seed))
    name = privatizer if isinstance(privatizer, str) else privatizer["name"]
    if isinstance(privatizer, str) and name in SMALL_MODEL_SETTINGS:
        privatizer = {"name": name, **SMALL_MODEL_SETTINGS[name]}
    optimizer = dpbench.OptimizerConfig(name="adam", lr=1e-3) if name in ("grape", "sparse", "dp_galore") else \
        torch.optim.SGD(model.parameters(), lr=0.0)
    return dpbench.make_private(model, optimizer, loader, privatizer, steps=20, noise_multiplier=1.0,
                                clip_norm=CLIP, **kwargs)


def _released(private: dpbench.PrivateTraining, batch) -> dict[str, torch.Tensor]:
    private.step(batch)
    return {name: p.grad.detach().clone() for name, p in private.model.named_parameters() if p.grad is not None}


def added_record_change(model: nn.Module, privatizer="vanilla", before=None, extra: torch.Tensor | None = None,
                        warmup: int = 2) -> float:
    """||released(B + x*) - released(B)|| * expected batch / C at the step after `warmup` steps; `before(model)`
    runs on both copies just before that step (the user's loop switching something on)."""
    generator = torch.Generator().manual_seed(1)
    batch = (torch.randn(BATCH, FEATURES, generator=generator), torch.randint(0, 2, (BATCH,), generator=generator))
    x = torch.randn(1, FEATURES, generator=generator) * 3 if extra is None else extra
    added = (torch.cat([batch[0], x]), torch.cat([batch[1], torch.tensor([1])]))
    released = []
    for step_batch in (batch, added):
        copy_ = copy.deepcopy(model)
        private = _private(copy_, privatizer)
        for _ in range(warmup):
            private.step(batch)
        if before is not None:
            before(copy_)
        released.append(_released(private, step_batch))
    change = torch.cat([(released[1][name] - released[0][name]).flatten() for name in released[0]])
    return float(change.norm()) * BATCH / CLIP


def _mix(model: nn.Module) -> None:
    model.mix = True


def test_mixup_switched_on_after_warmup_stays_within_c():
    model = WarmupMixup()
    assert fast_path_refusal(model) is not None
    assert added_record_change(model, before=_mix) <= 1.0 + 1e-4


def test_a_branch_only_an_outlier_takes_stays_within_c():
    outlier = torch.full((1, FEATURES), 10.0)
    assert added_record_change(OutlierCentring(), extra=outlier) <= 1.0 + 1e-4


@pytest.mark.parametrize("extra_records", [1])
def test_a_scale_chosen_by_the_batch_size_stays_within_c(extra_records):
    assert added_record_change(ParityScaled()) <= 1.0 + 1e-4


def test_the_same_mixing_on_a_proven_model_would_leak_so_proof_is_what_keeps_it_out():
    """The measurement can fail: the hook engine forced onto a mixing model (marked as dpbench-built, as a bug in a
    built-in would be) moves the sum by several C once the mixing starts after the first check."""
    model = built_by_dpbench(WarmupMixup())
    change = added_record_change(model, privatizer={"name": "vanilla", "engine": "hooks"}, before=_mix)
    assert change > 1.5


def test_the_batch_level_privatizers_refuse_an_unproven_model_naming_the_module_and_the_fix():
    for privatizer in ("jl", "grape", {"name": "sparse", "selection_epsilon": 1.0},
                       {"name": "vanilla", "engine": "hooks"}):
        with pytest.raises(UnsupportedModelError, match="WarmupMixup.*privatizer.engine=functorch"):
            _private(WarmupMixup(), privatizer)


def test_a_model_changed_after_the_proof_goes_to_vmap_before_the_step_that_would_use_it():
    """A proven model whose layer is swapped for a user's module between steps: auto continues on functorch, and the
    swapped step stays within C."""
    model = built_by_dpbench(nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 2)))

    def swap(copy_: nn.Module) -> None:
        copy_[1] = FlipMix()

    assert added_record_change(model, before=swap) <= 1.0 + 1e-4


def test_a_forward_hook_added_after_step_0_is_refused_by_the_hooks_and_avoided_by_auto():
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 2))
    assert fast_path_refusal(model) is None  # torch.nn layers only: proven structurally

    def hook(copy_: nn.Module) -> None:
        copy_[1].register_forward_hook(lambda module, args, out: out - out.mean(0, keepdim=True))

    assert added_record_change(model, before=hook) <= 1.0 + 1e-4
    private = _private(copy.deepcopy(model), {"name": "vanilla", "engine": "hooks"})
    hook(private.model)
    with pytest.raises(UnsupportedModelError, match="forward hook"):
        private.step((torch.randn(4, FEATURES), torch.tensor([0, 1, 0, 1])))


@pytest.mark.parametrize("privatizer", ["vanilla", "d2p2"])
def test_max_norm_embedding_is_refused_under_every_engine(privatizer):
    for engine in ("auto", "functorch", "hooks"):
        with pytest.raises(UnsupportedModelError, match="max_norm"):
            _private(TokenEmbedding(), {"name": privatizer, "engine": engine})


def test_a_forward_that_changes_a_parameter_in_place_stops_the_step_before_its_update():
    model = SelfNormalisingLinear()
    private = _private(model, "vanilla")
    with pytest.raises(UnsupportedModelError, match="fc.weight in place"):
        private.step((torch.randn(4, FEATURES), torch.tensor([0, 1, 0, 1])))
    assert private.ledger.steps == 0


def _poisoned_batch() -> tuple[torch.Tensor, torch.Tensor, SqrtFeatures]:
    """A batch in which one record's projection is exactly 0 on one unit (its backward is NaN there)."""
    torch.manual_seed(0)
    model = SqrtFeatures()
    x = torch.randn(BATCH, FEATURES).abs() + 0.1
    with torch.no_grad():
        model.fc1.weight.copy_(model.fc1.weight.abs())
        x[0] = 0.0  # fc1(x_0) = 0 on every unit: sqrt's backward at 0 is inf, masked by 0: NaN
    return x, torch.randint(0, 2, (BATCH,)), model


@pytest.mark.parametrize("privatizer", ["vanilla", "jl", "grape", "d2p2", "dp_galore"])
def test_one_record_with_a_nan_backward_never_makes_a_released_model_nan(privatizer):
    x, y, model = _poisoned_batch()
    model = built_by_dpbench(model)  # JL, GRAPE, DP-GaLore serve proven models only: as a built-in with this op
    with_record = _private(model, privatizer)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    with_record.step((x, y))
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    without = copy.deepcopy(built_by_dpbench(SqrtFeatures()))
    without.load_state_dict(before)
    without_record = _private(built_by_dpbench(without), privatizer)
    without_record.step((x[1:], y[1:]))
    if privatizer in ("vanilla", "jl"):  # the others clip in a projected space: their release is its image
        change = torch.cat([(p.grad - q.grad).flatten() for p, q in zip(model.parameters(), without.parameters(),
                                                                          strict=True)])
        assert float(change.norm()) * BATCH / CLIP <= 1.0 + 1e-4  # dropped: its contribution is 0


def test_jl_drops_the_record_whose_backward_is_nan_and_releases_the_rest():
    x, y, model = _poisoned_batch()
    model = built_by_dpbench(model)
    private = _private(model, "jl")
    output = private.step((x, y))
    assert math.isfinite(output.loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    assert private.ledger.steps == 1


# -- through the CLI, with the user's model -----------------------------------------------------------------------

def _user_cli(tmp_path, kind: str, *overrides: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_cli("--config-dir", "tests/conf", "model=user", f"model.kind={kind}", "max_steps=6", "batch_size=64",
                   "trainer.checkpoint=false", f"hydra.run.dir={tmp_path}", *FAST, *overrides, env=env)


@pytest.mark.parametrize("kind", ["mixup", "outlier", "parity"])
def test_cli_runs_a_user_model_under_vmap_and_says_so(tmp_path, kind):
    out = _user_cli(tmp_path, kind)
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    engine = results["per_sample_check"]["engine"]
    assert engine["name"] == "functorch" and "vmap" in engine["why"] and "Flattened" in engine["why"]


def test_cli_refuses_jl_on_a_user_model_in_one_line(tmp_path):
    out = _user_cli(tmp_path, "mixup", "privatizer=jl")
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()[-1]
    assert "Flattened" in last and "privatizer.engine=functorch" in last


def test_cli_refuses_a_max_norm_embedding_and_a_self_normalising_forward(tmp_path):
    out = _user_cli(tmp_path / "a", "embedding")
    assert out.returncode == 2 and "max_norm" in out.stderr.strip().splitlines()[-1]
    out = _user_cli(tmp_path / "b", "self_normalising")
    assert out.returncode == 2 and "in place" in out.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "b" / "results.json").exists() or json.loads(
        (tmp_path / "b" / "results.json").read_text()).get("steps", 0) == 0


def test_cli_jl_on_a_proven_model_with_a_nan_backward_record_stays_finite(tmp_path):
    """The built-in CNN cannot make a NaN backward; the model=user kind=sqrt plugin marked as built stands for a
    built-in that could."""
    out = _user_cli(tmp_path, "sqrt", "privatizer=jl", "model.proven=true", "trainer.checkpoint=true")
    assert out.returncode == 0, out.stderr[-2000:]
    assert torch.isfinite(final_weights(tmp_path)).all()
    results = json.loads((tmp_path / "results.json").read_text())
    assert math.isfinite(results["test_accuracy"]) and results["steps"] == 6


def test_a_private_run_logs_no_train_stats_by_default_and_its_files_ignore_the_umask(tmp_path):
    script = ("import os, sys, runpy; os.umask(0); sys.argv = ['dpbench', *sys.argv[1:]]; "
              "runpy.run_module('dpbench', run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", script, "max_steps=3", "trainer.checkpoint=true",
                          f"hydra.run.dir={tmp_path}", *FAST], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["outside_guarantee"] == []
    metrics = next(tmp_path.rglob("metrics.csv")).read_text().splitlines()[0]
    assert "train/" not in metrics
    for path in [tmp_path, *tmp_path.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_symlink():
            continue
        limit = 0o755 if path.is_dir() else 0o644
        assert mode & ~limit == 0, f"{path} is {oct(mode)}"


def test_make_private_module_logs_no_noise_free_statistics_of_private_batches(tmp_path):
    """A user's own Trainer with a CSV logger: the private module logs no train/* metric unless asked."""
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    from dpbench.data import DataBundle, TensorSplit

    features, targets = _dataset().tensors
    data = DataBundle("blobs", TensorSplit(features, targets), TensorSplit(features[:32], targets[:32]),
                      num_classes=2)
    module, datamodule = dpbench.make_private_module(
        nn.Sequential(nn.Linear(FEATURES, 2)), data, optimizer=dpbench.OptimizerConfig(name="sgd", lr=0.1),
        batch_size=BATCH, steps=3, noise_multiplier=1.0)
    trainer = L.Trainer(max_steps=3, logger=CSVLogger(tmp_path), log_every_n_steps=1, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
                        num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(module, datamodule=datamodule)
    logged = [path.read_text() for path in tmp_path.rglob("metrics.csv")]
    assert all("train/" not in text for text in logged)
    assert module.ledger.steps == 3


def _tiny_batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(4, FEATURES), torch.tensor([0, 1, 0, 1])


@pytest.mark.parametrize("privatizer", ["vanilla", "jl", "grape"])
def test_a_gradient_hook_on_a_parameter_is_refused_before_it_scales_a_privatized_gradient(privatizer):
    """JL's reweighted backward ran the user's hook on the clipped sum (x10 the sensitivity); the others skipped it."""
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 2))
    model[0].weight.register_hook(lambda g: g * 10)
    private = _private(model, privatizer)
    with pytest.raises(UnsupportedModelError, match="0.weight has a gradient hook"):
        private.step(_tiny_batch())
    assert private.ledger.steps == 0


def test_python_state_a_forward_keeps_is_refused_at_the_step_that_changes_it():
    model = RunningScale()
    private = _private(model, "vanilla")
    private.step(_tiny_batch())  # |x| < 5: nothing changes
    with pytest.raises(UnsupportedModelError, match="largest in place"):
        private.step((torch.full((2, FEATURES), 50.0), torch.tensor([0, 1])))
    assert private.ledger.steps == 1


def test_a_patched_layer_class_or_a_compiled_call_is_not_proven(monkeypatch):
    model = built_by_dpbench(nn.Sequential(nn.Linear(FEATURES, 4), nn.Tanh()))
    sequential = nn.Sequential(nn.Linear(FEATURES, 4), nn.Tanh())
    assert fast_path_refusal(model) is None and fast_path_refusal(sequential) is None
    monkeypatch.setattr(nn.Tanh, "forward", lambda self, h: torch.tanh(h).flip(0))
    assert "other modules than dpbench built it with" in fast_path_refusal(model)
    assert "class's forward patched" in fast_path_refusal(sequential)
    monkeypatch.undo()
    sequential[1]._compiled_call_impl = lambda h: torch.tanh(h).flip(0)
    assert "compiled or replaced call" in fast_path_refusal(sequential)


def test_a_parameter_replaced_after_attach_is_refused_by_the_hooks_and_moves_auto_to_vmap():
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 2))
    hooks = _private(copy.deepcopy(model), {"name": "vanilla", "engine": "hooks"})
    hooks.model[2].weight = nn.Parameter(hooks.model[2].weight.detach().clone())
    with pytest.raises(UnsupportedModelError, match="trainable parameters changed"):
        hooks.step(_tiny_batch())
    auto = _private(model, "vanilla")
    auto.step(_tiny_batch())
    model[2].weight = nn.Parameter(model[2].weight.detach().clone())
    auto.optimizer.param_groups[0]["params"][-2] = model[2].weight
    auto.step(_tiny_batch())
    assert auto.strategy.checks.engine["name"] == "functorch" and auto.ledger.steps == 2
