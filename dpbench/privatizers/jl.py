"""DP-SGD-JL / DP-Adam-JL (Bu et al. 2021, Algorithms 1-2): per-sample gradient norms from r JL projections.

Each step draws r standard Gaussian directions v_j over all trainable parameters and computes, in forward mode,
the Jacobian-vector products P_ij = <grad loss_i, v_j> of the per-sample loss vector; M_i = sqrt(mean_j P_ij^2)
estimates ||grad loss_i|| (unbiased in the square). The losses are reweighted by min(1, C / M_i) and one backward
pass gives the clipped sum; Gaussian noise sigma*C is added once per logical step. Nothing per-sample is ever
materialized, so it is black-box for any model and its memory stays close to non-private training.

The sensitivity is random (C * sqrt(r / chi2_r)), so each step is accounted as the chi-square mixture of
subsampled Gaussians of Theorems 2.2-2.3 (dpbench.privacy.mixture), never as the plain subsampled Gaussian.

Speed: a plain forward keeps the autograd graph that the backward reuses; then all r directions run without a graph,
batched with vmap over the tangents, so the primal is computed once per chunk of directions (a chunk of one runs as a
plain dual pass, which skips functorch's per-op wrapping). By default one chunk holds them all, or as many as half
the free memory holds, judged from the activations the graph pass saved (UNKNOWN_MEMORY_DIRECTIONS where the free
memory is unknown). The graph forward runs the jvp pass's kernels (math attention), so both passes round alike.
Until 2026-11-27 the first direction rode on the graph pass as a dual forward; the plain forward is 6-9% faster a
step on the CNN (eager) and the ViT (compiled) and within the spread on the ViT (eager; one thread, BENCHMARKS.md).
Recurrent models' graph forward runs the fused LSTM kernels (oneDNN, cuDNN), which have no forward-mode AD, and
records each nn.LSTM call; in the jvp pass every nn.LSTM reuses its recorded result as the primal and gets its tangents
from a linearised recurrence shared by the r directions (dpbench.privatizers.per_sample.forward_mode.lstm), and an
output sequence the loss never reads gets no tangent at all; other RNNs run their non-fused kernels in that pass.
Random ops such as dropout replay the same stream in both passes, max-pooling in the graph-free passes gathers at
the graph pass's argmax instead of pooling again (dpbench.privatizers.per_sample.forward_mode.pool), and convolutions,
linear layers, LayerNorm and GELU take dpbench's own forward-mode rules (per_sample.forward_mode.rules), which get the r
directions' tangents at once: the ViT's JL step at batch 500 took 1,590 against 1,830 ms with them (one thread, CPU).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.autograd.forward_ad as fwad
from torch import Tensor, nn
from torch.func import functional_call, jvp, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._pytree import tree_map

from dpbench.core.errors import ConfigurationError, NonFiniteStepError, UnsupportedModelError
from dpbench.core.tasks import Batch, Task, batch_size_of
from dpbench.privacy.accountant import PrivacyAccountant
from dpbench.privacy.mechanisms import Composition, Mechanism
from dpbench.privacy.mixture import SubsampledGaussianMixture
from dpbench.privacy.randomness import PrivateStream
from dpbench.privatizers.base import PrivacySettings, PrivatizerStrategy, StepContext
from dpbench.privatizers.clipping import clip_factors, clipping_stats
from dpbench.privatizers.per_sample import PerSampleMismatch, refuse_sample_mixing_layers, trainable_parameters
from dpbench.privatizers.per_sample.construction import require_fast_path
from dpbench.privatizers.per_sample.forward_mode.compiled import CompiledTangents
from dpbench.privatizers.per_sample.forward_mode.lstm import (
    Recorded,
    jvp_lstm_forward,
    mark_unread_outputs,
    record_call,
)
from dpbench.privatizers.per_sample.forward_mode.pool import gathering_pools, recording_pools
from dpbench.privatizers.per_sample.forward_mode.rules import tangent_rules
from dpbench.privatizers.per_sample.verify import (
    Deviation,
    as_trained_without_dropout,
    describe,
    deviation,
    merge,
    per_example_deviations,
    sample_mismatch,
    select,
)
from dpbench.profiling.memory import free_mb

MAX_PROJECTIONS = 1024
"""Largest r the epsilon advice searches (as many forward-mode passes a step)."""


@dataclass
class JLConfig:
    name: str = "jl"
    projections: int = 10
    """r, the number of JL directions per step: more is slower but estimates norms better (and costs less epsilon).
    At r = 1 the default run's epsilon is infinite at any noise multiplier up to 1000 (a step's estimated norm is
    often near 0, so its clipped gradient goes out nearly unscaled); at the default budget (epsilon 3, MNIST-5k,
    batch 500, 30 epochs) r = 10 is the smallest whose calibrated noise stays within 20% of vanilla DP-SGD's
    (sigma 3.40 against 2.88; r = 9: 3.55, r = 5: 8.9, r = 3: 53, r = 2: 563)."""
    chunk_size: int | None = None
    """Directions batched per vmap call: faster when larger, but the jvp pass holds about chunk_size times a
    forward pass's activations (1: memory close to non-private training); null: all of them, or as many as half the
    free memory (the CUDA device's, else the host's) holds, judged from the graph pass's saved activations."""
    compile: bool = False
    """torch.compile the graph-free directions (per_sample/forward_mode/compiled.py; functorch's rules, not dpbench's
    own). It pays a little on the ViT and loses on the CNN: JL r = 10 steps of the ViT at batch 500 took 1,501
    against 1,595 ms eager, of the CNN at batch 256 327 against 150 ms (one thread, CPU, 2026-11-27). Each padded
    batch size compiles once (about 45 s for that ViT on CPU). Refused for recurrent models and for models that draw
    random numbers (dropout)."""


@contextlib.contextmanager
def tangent_lstms(model: nn.Module, recorded: dict[nn.Module, Recorded | None]) -> Iterator[None]:
    """Run every nn.LSTM through its forward-mode rule, reusing the graph forward's recorded calls."""
    lstms = [module for module in model.modules() if isinstance(module, nn.LSTM)]
    for module in lstms:
        module.forward = functools.partial(jvp_lstm_forward, module, recorded=recorded.get(module))
    try:
        yield
    finally:
        for module in lstms:
            del module.forward


@contextlib.contextmanager
def recording_lstms(model: nn.Module) -> Iterator[dict[nn.Module, Recorded | None]]:
    """Record each nn.LSTM's calls during the graph forward (a module called twice keeps its last call's tensors,
    which the rule checks against its input before reusing, and every call's output edge)."""
    recorded: dict[nn.Module, Recorded | None] = {}

    def record(module: nn.Module, args: tuple, output: tuple) -> None:
        recorded[module] = record_call(module, args, output, recorded.get(module))

    handles = [module.register_forward_hook(record) for module in model.modules() if isinstance(module, nn.LSTM)]
    try:
        yield recorded
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def forward_ad_kernels(model: nn.Module, recorded: dict[nn.Module, Recorded | None] | None = None) -> Iterator[None]:
    """Kernels with forward-mode AD: math attention (fused CPU attention has none) and, for recurrent models, the
    LSTM rule and the non-fused kernels of other RNNs (oneDNN and cuDNN have none; they would slow convolutions,
    hence only for models with such RNNs)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(sdpa_kernel(SDPBackend.MATH))
        if recorded is not None:
            stack.enter_context(tangent_lstms(model, recorded))
        if any(isinstance(m, nn.RNNBase) and not isinstance(m, nn.LSTM) for m in model.modules()):
            stack.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", ".*TF32 acceleration on top of oneDNN.*")  # a CPU build's notice
            stack.enter_context(torch.backends.mkldnn.flags(enabled=False))
            stack.enter_context(torch.backends.cudnn.flags(enabled=False))
        yield


MEMORY_SHARE = 0.5
"""Share of the free memory that the directions of one jvp chunk may take when chunk_size is null."""
UNKNOWN_MEMORY_DIRECTIONS = 4
"""Directions per vmap call when chunk_size is null and the free memory cannot be read. Where it can, one call takes
every direction that fits: with the host memory that steps free kept (training/host_memory.py), nine graph-free
directions in one call took 172-198 ms a step on the CNN (batch 256) against 220-222 ms in chunks of 4, 4 and 1, and
1,862-1,907 against 2,177-2,196 ms on the ViT (batch 500; one thread, 2026-11-27, BENCHMARKS.md). Chunks of 4 were
the faster choice only while glibc faulted the larger calls' memory in again at every step."""


@contextlib.contextmanager
def counting_saved_bytes(model: nn.Module) -> Iterator[list[int]]:
    """Bytes of the activations that autograd saves in the block (each storage once, parameters not counted): what
    one more forward-mode direction holds, about, at most."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set[int] = set()
    total = [0]

    def pack(tensor: Tensor) -> Tensor:
        try:
            storage = tensor.untyped_storage()
            pointer, size = storage.data_ptr(), storage.nbytes()
        except RuntimeError:  # a tensor without a plain storage: its own size
            pointer, size = None, tensor.nelement() * tensor.element_size()
        if pointer is None or (pointer not in seen and pointer not in parameters):
            seen.add(pointer)
            total[0] += size
        return tensor.detach()  # the live tensor would tie a cycle through its grad_fn that no collector frees

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield total


def dual_losses(
    model: nn.Module, task: Task, batch: Batch, params: dict[str, Tensor], tangents: dict[str, Tensor]
) -> tuple[Tensor, Tensor]:
    """Per-sample losses and their jvp along one tangent, in one forward-AD pass (the losses keep whatever autograd
    graph `params` give them; a zero jvp when no parameter reaches the losses)."""
    with fwad.dual_level():
        duals = {name: fwad.make_dual(p, tangents[name]) for name, p in params.items()}
        losses, tangent = fwad.unpack_dual(task.per_sample_loss(lambda x: functional_call(model, duals, (x,)), batch))
    return losses, torch.zeros_like(losses) if tangent is None else tangent


def directional_projections(
    model: nn.Module, task: Task, params: dict[str, Tensor], tangents: dict[str, Tensor], batch: Batch
) -> Tensor:
    """(count, B) projections <grad loss_i, v_j> along stacked directions, by vmap over jvps without an autograd
    graph (random ops draw the same numbers for every direction)."""
    def losses(values: dict[str, Tensor]) -> Tensor:
        return task.per_sample_loss(lambda x: functional_call(model, values, (x,)), batch)

    return vmap(lambda t: jvp(losses, (params,), (t,))[1], randomness="same")(tangents)


class Replay:
    """The global random state at the start of a step, restorable, so every pass sees the same random ops."""

    def __init__(self, model: nn.Module):
        self.devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
        self.cpu = torch.get_rng_state()
        self.cuda = [torch.cuda.get_rng_state(device) for device in self.devices]

    def drawn(self) -> bool:
        """Whether random numbers were drawn since the start of the step."""
        return not torch.equal(torch.get_rng_state(), self.cpu) or any(
            not torch.equal(torch.cuda.get_rng_state(device), state)
            for device, state in zip(self.devices, self.cuda, strict=True))

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        for device, state in zip(self.devices, self.cuda, strict=True):
            torch.cuda.set_rng_state(state, device)


class JL(PrivatizerStrategy):
    name = "jl"
    per_sample_activation_share = 0.25  # the graph-free passes' tangents (BiLSTM: BENCHMARKS.md)

    def __init__(self, config: JLConfig, privacy: PrivacySettings):
        super().__init__(config, privacy)
        if config.projections < 1:
            raise ConfigurationError(f"privatizer.projections (r) must be at least 1, got {config.projections}")
        if config.chunk_size is not None and config.chunk_size < 1:
            raise ConfigurationError(f"privatizer.chunk_size must be positive or null, got {config.chunk_size}")
        self.directions = PrivateStream(privacy.randomness, "jl")  # secret, and never the noise's stream

    # -- privacy ---------------------------------------------------------------------------------------------
    def mechanism(self, noise_multiplier: float) -> SubsampledGaussianMixture:
        """Theorem B.7: sensitivity C * sqrt(r / chi2_r) under noise sigma * C, Poisson-subsampled."""
        return SubsampledGaussianMixture(self.privacy.sampling_rate, noise_multiplier, self.config.projections, 1.0)

    def step_mechanisms(self, step: int) -> list[Mechanism]:
        return [self.mechanism(self.noise_multiplier)]

    def composition(self, noise_multiplier: float, steps: int) -> Composition:
        return [(self.mechanism(noise_multiplier), steps)]

    def smallest_projections(
        self, noise_multiplier: float, target: float, steps: int, delta: float, accountant: PrivacyAccountant
    ) -> int | None:
        """Smallest r above the configured one whose epsilon at `noise_multiplier` is within `target` (finite for an
        infinite target), up to MAX_PROJECTIONS; epsilon decreases with r (Bu et al. 2021, Figure 3), so a
        doubling search then a bisection cost a dozen accountant calls."""
        def reaches(r: int) -> bool:
            mechanism = SubsampledGaussianMixture(self.privacy.sampling_rate, noise_multiplier, r, 1.0)
            epsilon = accountant.epsilon([(mechanism, steps)], delta).epsilon
            return epsilon <= target if math.isfinite(target) else math.isfinite(epsilon)

        low, high = self.config.projections, self.config.projections + 1
        while not reaches(high):
            if high >= MAX_PROJECTIONS:
                return None
            low, high = high, min(2 * high, MAX_PROJECTIONS)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if reaches(middle) else (middle, high)
        return high

    def epsilon_advice(
        self, noise_multiplier: float, target: float, steps: int, delta: float, accountant: PrivacyAccountant
    ) -> str | None:
        """r, not epsilon or the schedule, is what keeps a small-r run's epsilon up: a chi-square with few degrees
        of freedom is often near 0, and then the estimated norm is tiny and the clipped gradient nearly unscaled."""
        r = self.smallest_projections(noise_multiplier, target, steps, delta, accountant)
        within = f"within epsilon={target:g}" if math.isfinite(target) else "to a finite epsilon"
        found = (f"privatizer.projections={r} is the smallest that brings it {within} at noise multiplier "
                 f"{noise_multiplier:g} (larger r needs less noise, down to vanilla DP-SGD's)" if r is not None
                 else f"no r up to {MAX_PROJECTIONS} brings it {within} at noise multiplier {noise_multiplier:g}")
        return (f"privatizer.projections={self.config.projections} (r, the JL directions per step) limits the "
                f"privacy of this run: raise it; {found}")

    # -- before anything runs ---------------------------------------------------------------------------------
    def preflight(self, model: nn.Module, optimizer_config: Any | None) -> None:
        super().preflight(model, optimizer_config)
        self._check_model(model)
        dimensions = sum(p.numel() for p in trainable_parameters(model).values())
        if self.config.projections >= dimensions:
            raise ConfigurationError(
                f"privatizer.projections={self.config.projections} is not below the model's {dimensions:,} trainable "
                f"parameters: exact per-sample norms cost less than that many JL directions and need no estimate; "
                f"run privatizer=vanilla, or lower privatizer.projections")

    def method_details(self, model: nn.Module) -> dict[str, Any]:
        return {"projections": self.config.projections,
                "trainable_parameters": sum(p.numel() for p in trainable_parameters(model).values())}

    def _check_model(self, model: nn.Module) -> None:
        refuse_sample_mixing_layers(model)
        require_fast_path(model, "privatizer=jl (one shared backward over the batch)")
        if self.config.compile and any(isinstance(module, nn.RNNBase) for module in model.modules()):
            raise ConfigurationError(
                "privatizer.compile=true covers models without recurrent layers (their tangents come from the graph "
                "pass's recorded calls, which the compiled pass does not replay): set privatizer.compile=false")

    # -- training --------------------------------------------------------------------------------------------
    def attach(self, model: nn.Module) -> None:
        self._check_model(model)
        self.recurrent = any(isinstance(module, nn.RNNBase) for module in model.modules())
        self._sums: dict[str, Tensor] = {}
        self._compiled: CompiledTangents | None = None

    def _draw(self, params: dict[str, Tensor], count: int) -> dict[str, Tensor]:
        """`count` standard Gaussian directions over all trainable parameters: (count, *shape) per parameter."""
        draws = self.directions.on(next(iter(params.values())).device)
        return {name: draws.normal((count, *p.shape), p.dtype) for name, p in params.items()}

    def _chunk_sizes(self, count: int, activation_bytes: int, device: torch.device) -> list[int]:
        """Directions per vmap call: chunk_size each (the last fewer); when it is null, all of them, or as many as
        half the free memory holds (at least one; UNKNOWN_MEMORY_DIRECTIONS where the free memory is unknown)."""
        size = self.config.chunk_size
        if size is None:
            free = free_mb(device)
            if free is None:
                size = UNKNOWN_MEMORY_DIRECTIONS
            else:
                size = int(MEMORY_SHARE * free * 2**20 // activation_bytes) if activation_bytes > 0 else count
            size = max(1, min(count, size))
        return [min(size, count - start) for start in range(0, count, size)]

    def _jvp_chunks(
        self, model: nn.Module, task: Task, batch: Batch, params: dict[str, Tensor], count: int,
        replay: Callable[[], None], activation_bytes: int,
    ) -> Tensor:
        """(B, count) projections <grad loss_i, v_j>, without an autograd graph, directions batched by vmap; every
        chunk first calls `replay`, which restores what the pass whose graph the backward uses saw (its random
        stream, so the same dropout masks, and its max-pooling argmax)."""
        parts = []
        with torch.no_grad():
            for chunk in self._chunk_sizes(count, activation_bytes, next(iter(params.values())).device):
                tangents = self._draw(params, chunk)
                if self._compiled is not None:  # no random ops to replay (projections checks)
                    parts.append(self._compiled(params, tangents, batch))
                    continue
                replay()
                if chunk == 1:  # a plain dual pass: forward AD's native rules, without functorch wrapping each op
                    parts.append(dual_losses(model, task, batch, params, tree_map(lambda t: t[0], tangents))[1][None])
                else:
                    parts.append(directional_projections(model, task, params, tangents, batch))
        if not parts:
            return torch.zeros(batch_size_of(batch), 0, device=next(iter(params.values())).device)
        return torch.cat(parts).T

    def projections(self, model: nn.Module, task: Task, batch: Batch) -> tuple[Tensor, Tensor]:
        """Per-sample losses (with their autograd graph) and the (B, r) JL projections of their gradients: the graph
        pass first (recording each nn.LSTM call and max-pooling argmax), then the r directions without a graph, each
        chunk replaying the graph pass's random ops."""
        trainable = trainable_parameters(model)
        detached = {name: p.detach() for name, p in trainable.items()}
        replay = Replay(model)
        graph_kernels = contextlib.nullcontext() if self.recurrent else forward_ad_kernels(model)
        # compiled, max-pooling pools again (the padded shapes differ from any record), so nothing is recorded
        pooling = contextlib.nullcontext({}) if self.config.compile else recording_pools(model)
        with recording_lstms(model) as recorded, pooling as pools, counting_saved_bytes(model) as saved:
            with graph_kernels:
                losses = task.per_sample_loss(model, batch)
        if self.recurrent:
            mark_unread_outputs(recorded, losses)
        if self.config.compile:
            self._refuse_random_ops(replay)
            if self._compiled is None:
                self._compiled = CompiledTangents(functools.partial(directional_projections, model, task))
        kernels = forward_ad_kernels(model, recorded if self.recurrent else None)
        rules = contextlib.nullcontext() if self.config.compile else tangent_rules(model)
        with torch.random.fork_rng(devices=replay.devices), kernels, rules, gathering_pools(pools) as gathering:
            def restore() -> None:
                replay.restore()
                gathering.rewind()

            projected = self._jvp_chunks(model, task, batch, detached, self.config.projections, restore, saved[0])
        return losses, projected

    @staticmethod
    def _refuse_random_ops(replay: Replay) -> None:
        if replay.drawn():
            raise UnsupportedModelError(
                "privatizer.compile=true: the model draws random numbers in training mode (dropout, stochastic "
                "depth), and the compiled tangent pass would draw other ones than the pass whose gradient is clipped: "
                "set the model's dropout to 0, or privatizer.compile=false")

    def reweighted_sum(self, model: nn.Module, losses: Tensor, norms: Tensor) -> dict[str, Tensor]:
        """sum_i min(1, C / norms_i) grad loss_i by one backward pass (exact clipping when norms are exact)."""
        trainable = trainable_parameters(model)
        factors = clip_factors(norms.detach(), self.privacy.clip_norm)
        grads = torch.autograd.grad((losses * factors).sum(), list(trainable.values()), allow_unused=True)
        return {name: torch.zeros_like(p) if g is None else g for (name, p), g in zip(trainable.items(), grads,
                                                                                       strict=True)}

    def _check_gradients(self, model: nn.Module, task: Task, batch: Batch) -> None:
        """Each checked sample's gradient in the batch is its gradient alone, on the checks' schedule: JL's
        projections and its reweighted backward clip exactly only then. Gradients, not losses: a layer can leave every
        loss its sample's own and still mix the samples' gradients (h + a (m - m.detach()) with m a batch mean)."""
        started = time.perf_counter()
        params = trainable_parameters(model)
        bad: dict[str, float] = {}
        with as_trained_without_dropout(model) as draws:
            losses = task.per_sample_loss(model, batch)
            if draws.drawn():
                raise UnsupportedModelError(
                    f"the model draws random numbers in training mode besides dropout ({draws.describe()}: "
                    "stochastic depth, a noise layer?), so JL cannot check that each sample's gradient in the batch "
                    "is its own (a sample alone draws other numbers): turn that randomness off (e.g. "
                    "drop_path_rate=0), or use privatizer=vanilla, whose functorch engine is per-sample by "
                    "construction")
            finite = torch.isfinite(losses.detach())
            if not bool(finite.all()):  # as the step drops them: a NaN row poisons the others' batched gradients
                kept = finite.nonzero().flatten().tolist()
                batch = select(batch, kept)
                losses = task.per_sample_loss(model, batch) if kept else losses[:0]
            for sample in self.checks.samples(batch_size_of(batch)):
                bad = merge(bad, self._sample_mismatch(model, task, batch, losses, params, sample))
        self.checks.checked(time.perf_counter() - started, set())
        if not bad:
            return
        message = (f"the gradients of {describe(bad)} of a sample in the batch differ from its gradient alone: the "
                   "model mixes samples while training (e.g. batch statistics), so JL's projections and reweighted "
                   "backward would not clip each sample's gradient: remove that layer (GroupNorm or LayerNorm instead "
                   "of batch statistics)")
        if len(self.checks.checked_steps) <= 1:
            raise UnsupportedModelError(message)
        step = self.checks.checked_steps[-1]
        raise PerSampleMismatch(f"at step {step}, {message}. The steps before {step} were clipped with mixed "
                                "gradients, so the epsilon reported for them is not a guarantee", step, sorted(bad))

    @staticmethod
    def _sample_mismatch(model: nn.Module, task: Task, batch: Batch, losses: Tensor, params: dict[str, nn.Parameter],
                         sample: int) -> dict[str, float]:
        """Parameters whose gradient of loss_sample in the batch is not the sample's own (verify.sample_mismatch)."""
        in_batch = torch.autograd.grad(losses[sample], list(params.values()), retain_graph=True, allow_unused=True)
        got = {name: torch.zeros_like(p) if g is None else g
               for (name, p), g in zip(params.items(), in_batch, strict=True)}
        if not all(bool(torch.isfinite(g).all()) for g in got.values()):
            return {}  # the step drops a sample whose gradient is not finite: nothing of it to compare

        def compare(name: str, param: nn.Parameter, grad: Tensor | None) -> Deviation:
            return deviation(got[name].clone(), float(got[name].norm()),
                             torch.zeros_like(param) if grad is None else grad)

        try:
            return sample_mismatch(
                lambda copies: per_example_deviations(model, task, batch, sample, params, compare, copies),
                batch_size_of(batch))
        except RuntimeError as error:  # e.g. a model that cannot run a batch of one
            raise UnsupportedModelError(f"per-example backward passes through this model failed ({error}), so JL "
                                        "cannot check that it keeps the samples' gradients apart") from error

    def accumulate(self, model: nn.Module, task: Task, batch: Batch, ctx: StepContext) -> tuple[float, dict]:
        if batch_size_of(batch) == 0:  # an empty Poisson batch is still a step: noise only
            return 0.0, {"batch_size": 0.0}
        require_fast_path(model, "privatizer=jl (one shared backward over the batch)", task)  # changed since?
        if batch_size_of(batch) > 1 and self.checks.due():
            self._check_gradients(model, task, batch)
        losses, projected = self.projections(model, task, batch)
        estimates = projected.pow(2).mean(1).sqrt()
        stats = clipping_stats(estimates, self.privacy.clip_norm)
        while True:
            finite = torch.isfinite(estimates)
            if bool(finite.all()):
                sums = self.reweighted_sum(model, losses, estimates)
                if all(bool(torch.isfinite(g).all()) for g in sums.values()):
                    break
                # finite norms, a non-finite backward (0 * inf in a backward formula): one record would turn the
                # released step NaN, so its samples are found and dropped as vanilla drops them
                finite = self._finite_backwards(model, task, batch, estimates)
            # NaN activations would poison the shared backward: drop those samples and redo both passes on the rest,
            # so that the norms and the backward again see the same random ops (dropout masks)
            keep = finite.nonzero().flatten()
            if keep.numel() == 0:
                return 0.0, stats
            batch = (tree_map(lambda t, rows=keep: t[rows], batch[0]), batch[1][keep])
            losses, projected = self.projections(model, task, batch)
            estimates = projected.pow(2).mean(1).sqrt()
        for name, grad in sums.items():
            self._sums[name] = self._sums[name] + grad if name in self._sums else grad
        return float(losses.detach().sum()), stats

    def _finite_backwards(self, model: nn.Module, task: Task, batch: Batch, estimates: Tensor) -> Tensor:
        """(B,) True where the sample's own reweighted gradient, from a pass of the sample alone, is finite. A batch
        whose shared backward is not finite while every sample's own is stops the run before anything is released."""
        params = list(trainable_parameters(model).values())
        factors = clip_factors(estimates.detach(), self.privacy.clip_norm)
        finite = torch.ones_like(estimates, dtype=torch.bool)
        for i in range(batch_size_of(batch)):
            loss = task.per_sample_loss(model, select(batch, [i]))[0] * factors[i]
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            finite[i] = all(g is None or bool(torch.isfinite(g).all()) for g in grads)
        if bool(finite.all()):
            raise NonFiniteStepError(
                "privatizer=jl: the batch's reweighted backward is not finite although every sample's own is; the "
                "run stops before releasing the step: find the op whose backward overflows")
        return finite

    def finalize(self, model: nn.Module, ctx: StepContext) -> None:
        self.write_noisy_mean(model, self._sums, ctx)
        self._sums = {}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "directions": self.directions.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.directions.load_state_dict(state["directions"])
