"""The CUDA paths, run by `make gpu-check` on a GPU (marked `cuda`, skipped without one): per-sample gradients,
clipping and noise on the device, a real run through the CLI, and the frontier's capped trials."""

import pytest
import torch
from omegaconf import OmegaConf

from dpbench.app.max_batch import run_trial
from dpbench.core.tasks import ClassificationTask
from dpbench.models.cnn import TFPrivacyCNN
from dpbench.privacy.randomness import PrivacyRandomness
from dpbench.privatizers import PrivacySettings, make_strategy
from dpbench.privatizers.base import StepContext
from dpbench.privatizers.per_sample import FunctorchEngine, HookEngine, MaterializedEngine
from tests.helpers.cli import FAST, dpbench, results
from tests.helpers.jl_projections import projections_and_reference
from tests.helpers.models import CASES, cnn_batch
from tests.helpers.per_sample_reference import loop_gradients
from tests.helpers.tangent_models import Block, ConvNet, SharedLayer
from tests.helpers.transformer_models import TRANSFORMERS

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

TASK = ClassificationTask()
MODELS = {**CASES, **{name: TRANSFORMERS[name] for name in ("opt", "roberta", "vit")}}


def on_cuda(batch):
    inputs, targets = batch
    inputs = {k: v.cuda() for k, v in inputs.items()} if isinstance(inputs, dict) else inputs.cuda()
    return inputs, targets.cuda()


@pytest.mark.parametrize("engine_class", [HookEngine, MaterializedEngine, FunctorchEngine])
@pytest.mark.parametrize("case", sorted(MODELS))
def test_clipped_sums_on_cuda_match_a_per_example_loop(engine_class, case):
    torch.manual_seed(0)
    build, make_batch = MODELS[case]
    model = build().cuda()
    batch = on_cuda(make_batch())
    reference = loop_gradients(model, batch)
    norms = torch.stack([torch.sqrt(sum(g.pow(2).sum() for g in r.values())) for r in reference])
    clip = float(norms.median())
    result = engine_class(model).clipped_sum(TASK, batch, clip)
    torch.testing.assert_close(result.norms, norms, atol=1e-4, rtol=1e-3)
    for name, _ in model.named_parameters():
        expected = sum(min(1.0, clip / (float(n) + 1e-6)) * r[name] for n, r in zip(norms, reference, strict=True))
        torch.testing.assert_close(result.grads[name], expected, atol=1e-4, rtol=1e-3)


def vanilla(sigma: float, clip: float, engine: str = "auto"):
    settings = PrivacySettings(clip, 0.1, sigma, PrivacyRandomness(0))
    return make_strategy(OmegaConf.create({"name": "vanilla", "engine": engine}), settings)


@pytest.mark.parametrize("engine", ["hooks", "materialized"])
def test_each_contribution_on_cuda_is_bounded_even_for_a_huge_outlier(engine):
    torch.manual_seed(0)
    model = TFPrivacyCNN(activation="relu").cuda()  # tanh saturates, so its gradients stay small for any input
    inputs, targets = on_cuda(cnn_batch(8))
    inputs[3] *= 1e6  # an outlier whose gradient norm is enormous: confidently wrong
    targets[3] = model(inputs[3:4]).argmin()
    clip = 0.7
    strategy = vanilla(1.0, clip, engine)
    strategy.attach(model)
    assert strategy.engine.clipped_sum(TASK, (inputs, targets), clip).norms[3] > 1e3 * clip
    for i in range(8):
        alone = strategy.engine.clipped_sum(TASK, (inputs[i : i + 1], targets[i : i + 1]), clip)
        assert torch.sqrt(sum(g.pow(2).sum() for g in alone.grads.values())) <= clip * (1 + 1e-5)


def test_noise_on_cuda_has_standard_deviation_sigma_c():
    model = torch.nn.Linear(500, 200).cuda()
    sigma, clip, expected = 1.3, 0.5, 40.0
    strategy = vanilla(sigma, clip)
    strategy.attach(model)
    batch = (torch.randn(16, 500, device="cuda"), torch.randint(0, 200, (16,), device="cuda"))
    clipped = strategy.engine.clipped_sum(TASK, batch, clip).grads
    strategy.privatize(model, TASK, batch, StepContext(0, expected))
    noise = torch.cat([(p.grad * expected - clipped[n]).flatten() for n, p in model.named_parameters()])
    assert noise.device.type == "cuda"
    assert float(noise.std()) == pytest.approx(sigma * clip, rel=0.01)


def _jl_case(case: str, rows: int) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    if case == "transformer block":
        return Block(), torch.randn(rows, 3, 5)
    if case == "convolutions":
        return ConvNet(dims=2, groups=2), torch.randn(rows, 2, 7, 7)
    if case == "TF-Privacy CNN (max-pooling)":
        return TFPrivacyCNN(activation="relu"), torch.randn(rows, 1, 28, 28)
    if case == "shared layer, bias-only tangent":
        model = SharedLayer()
        model.shared.weight.requires_grad_(False)  # a bias-only tangent, which must not alias its direction
        return model, torch.randn(rows, 4)
    raise ValueError(f"no JL case {case!r}")


def jl_projections_on(device: str, case: str, rows: int, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """JL's projections of a float64 model on `device` by its own tangent rules (convolution, linear, LayerNorm,
    GELU, max-pooling), and a per-example loop's <grad loss_i, v_j> along the same directions."""
    model, x = _jl_case(case, rows)
    model = model.double().to(device)
    batch = (x.double().to(device), torch.randint(0, 3, (rows,), device=device))
    model(batch[0])  # materialise lazy layers
    return projections_and_reference(model, batch, chunk_size)


JL_CASES = ["transformer block", "convolutions", "TF-Privacy CNN (max-pooling)", "shared layer, bias-only tangent"]


@pytest.mark.parametrize("chunk_size", [1, 4], ids=["dual pass", "vmap chunk"])
@pytest.mark.parametrize("rows", [1, 6])
@pytest.mark.parametrize("case", JL_CASES)
def test_jl_projections_on_cuda_are_the_per_example_gradients_along_the_directions(case, rows, chunk_size):
    """The tangent rules' batched products (a stride-0 operand among them) and in-place passes, on the device."""
    projected, reference = jl_projections_on("cuda", case, rows, chunk_size)
    assert projected.device.type == "cuda" and projected.shape == reference.shape == (rows, 4)
    torch.testing.assert_close(projected, reference, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("privatizer", ["vanilla", "materialized", "grape", "jl"])
def test_a_run_on_cuda_trains_and_reports_max_memory_reserved(tmp_path, privatizer):
    run = dpbench(*FAST, f"privatizer={privatizer}", "optimizer=adam", "trainer.accelerator=gpu", "max_steps=6",
                  "profiler.warmup_steps=2", "epochs=1", "batch_size=64", f"hydra.run.dir={tmp_path}")
    assert run.returncode == 0, run.stderr[-3000:]
    record = results(tmp_path)
    assert record["device"] == torch.cuda.get_device_name()
    assert record["memory_method"] == "cuda.max_memory_reserved" and record["peak_memory_mb"] > 0
    assert record["steps"] == 6 and record["epsilon"] > 0


def test_a_trial_past_the_device_cap_is_recorded_out_of_memory_not_raised():
    overrides = ["model=cnn_large", "data=digits", "privatizer=materialized", "optimizer=adam"]
    fits = run_trial(overrides, 8, cap_mb=8000, steps=3, device="cuda")
    assert fits.fits and fits.process_peak_mb > 0 and fits.samples_per_s > 0
    over = run_trial(overrides, 1 << 16, cap_mb=fits.process_peak_mb * 2, steps=3, device="cuda")
    assert not over.fits and over.stage == "steps"


def test_a_transformer_run_on_cuda_keeps_the_hook_engine(tmp_path):
    """On an H100 the checks once read CUDA's generator state, which moved with no random op run, so every
    transformer fell back from the hooks to a per-example loop (and OPT-1.3B's DP-Adam ran out of memory at batch 8)."""
    run = dpbench(*FAST, "model=opt", "data=rotten_tomatoes", "data.tokenizer=hf:minilm", "data.train_size=256",
                  "data.max_length=32", "privatizer=vanilla", "privatizer.engine=hooks", "optimizer=adam",
                  "trainer.accelerator=gpu", "max_steps=4", "epochs=1", "batch_size=32", f"hydra.run.dir={tmp_path}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert results(tmp_path)["per_sample_check"]["switched_engine"] is None


def test_cuda_draws_seed_philox_and_its_offset_from_the_key():
    """On CUDA the secret draws come from torch's Philox: 64 bits of seed and an offset from 60 more key bits."""
    from dpbench.privacy.randomness import PrivacyRandomness

    randomness = PrivacyRandomness(7)
    draws = randomness.draws("noise", 0, device="cuda")
    assert draws.generator.get_offset() % 4 == 0 and draws.generator.get_offset() > 0
    assert not torch.equal(draws.normal((64,)), randomness.draws("noise", 1, device="cuda").normal((64,)))
