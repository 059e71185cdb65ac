"""Sparse DP training for wide networks (Zhang, Mironov, Hejazinia, Algorithm 3): update only privately selected
coordinates, and add noise only there.

Per step: per-sample gradients clipped to S1 (privacy.clip_norm), computed sparsely (an embedding's per-sample
gradient lives on the sample's rows only); their sum over the expected batch size b; selection of k = sparsity * p
coordinates (exponential mechanism on scores min(|g|, S0), the sparse vector technique, or uniformly at random);
the selected part clipped to S2; Gaussian noise on the selected coordinates only; Adam (or SGD) on those alone.

Sensitivities are the code's, not the paper's: a score moves by at most s0 = min(S0, S1/b) when one sample is added
or removed, and the clipped selected vector by at most min(S1/b, 2 S2) (clipping is a projection onto the S2 ball,
so two clipped vectors differ by at most 2 S2; the paper's noise assumes S2). Noise std = sigma * min(S1/b, 2 S2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from dpbench.core.errors import ConfigurationError
from dpbench.core.tasks import Batch, Task, batch_size_of
from dpbench.privacy.mechanisms import Composition, Mechanism, SubsampledGaussian
from dpbench.privacy.sparse_step_accounting import SubsampledSelectionGaussian, theorem3_bound
from dpbench.privatizers.base import PrivatizerStrategy, StepContext
from dpbench.privatizers.clipping import clipping_stats
from dpbench.privatizers.coordinate_selection import exponential_top_k, sparse_vector, uniform_untouched
from dpbench.privatizers.per_sample import HookEngine, check_hook_engine, trainable_parameters
from dpbench.privatizers.per_sample.sites import EmbeddingSite

SELECTIONS = ("exponential", "svt", "random")


@dataclass
class SparseConfig:
    name: str = "sparse"
    selection: str = "exponential"
    """exponential (Algorithm 4) | svt (sparse vector technique, Algorithm 1) | random (no privacy cost)."""
    sparsity: float = 0.001
    """gamma: k = round(gamma * p) coordinates are selected per step."""
    clip2: float = 0.05
    """S2: norm bound of the selected part of the averaged gradient (second clipping)."""
    selection_clip: float = 0.1
    """S0: bound on each coordinate's selection score."""
    selection_epsilon: float | None = None
    """Epsilon (at privacy.delta) the selection alone may spend; null: selection_share * privacy.epsilon."""
    selection_share: float = 0.3333333333333333
    """The paper's split: epsilon 10 of 30 for selection."""
    draw_epsilon: float | None = None
    """Epsilon of each draw (each SVT round); null: calibrated to the selection budget."""
    svt_threshold: float = 0.5
    """SVT threshold alpha, in units of S0."""
    calibration_tolerance: float = 0.01
    lazy_adam: bool = True
    """true: Adam's moments and bias correction advance only where a coordinate is selected, so nothing else moves.
    false: torch's Adam on the released update (zero off the selection), as the paper's Opacus code ran it: moments
    decay every step, so a coordinate keeps moving on its momentum after it was selected (post-processing, no
    privacy cost)."""


@dataclass
class _Layout:
    param: nn.Parameter
    offset: int
    rows: int
    cols: int


def _check_optimizer(optimizer_config: Any) -> None:
    if optimizer_config.name not in ("adam", "sgd"):
        raise ConfigurationError(f"privatizer=sparse supports optimizer=adam|sgd, got {optimizer_config.name!r}")
    if optimizer_config.weight_decay or (optimizer_config.name == "sgd" and optimizer_config.momentum):
        raise ConfigurationError("privatizer=sparse updates selected coordinates only: no weight decay, momentum")
    if optimizer_config.lr <= 0:
        raise ConfigurationError(f"optimizer.lr must be positive, got {optimizer_config.lr}")


class SelectedCoordinateOptimizer(Optimizer):
    """Adam (per-coordinate moments and bias correction, advanced only when a coordinate is selected) or SGD on
    the selected coordinates alone; all other coordinates and their state stay untouched."""

    def __init__(self, params, name: str, lr: float, betas: tuple[float, float], eps: float):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps})
        self.name = name
        self.pending: dict[nn.Parameter, tuple[Tensor, Tensor]] = {}

    def step(self, closure=None):
        """Apply the updates the strategy left in `pending` (a real step, so Lightning counts it)."""
        loss = None
        if closure is not None:  # Lightning's hooks run in it, as for torch's optimizers
            with torch.enable_grad():
                loss = closure()
        self.step_coordinates(self.pending)
        self.pending = {}
        return loss

    @torch.no_grad()
    def step_coordinates(self, updates: dict[nn.Parameter, tuple[Tensor, Tensor]]) -> None:
        for group in self.param_groups:
            for param in group["params"]:
                if param not in updates:
                    continue
                index, grad = updates[param]
                flat = param.view(-1)
                if self.name == "sgd":
                    flat.index_add_(0, index, -group["lr"] * grad)
                    continue
                state = self.state[param]
                if not state:
                    state["exp_avg"] = torch.zeros_like(flat)
                    state["exp_avg_sq"] = torch.zeros_like(flat)
                    state["steps"] = torch.zeros_like(flat)
                beta1, beta2 = group["betas"]
                m = state["exp_avg"][index].mul_(beta1).add_(grad, alpha=1 - beta1)
                v = state["exp_avg_sq"][index].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                n = state["steps"][index].add_(1)
                state["exp_avg"][index], state["exp_avg_sq"][index], state["steps"][index] = m, v, n
                m_hat, v_hat = m / (1 - beta1**n), v / (1 - beta2**n)
                flat.index_add_(0, index, -group["lr"] * m_hat / (v_hat.sqrt() + group["eps"]))


class Sparse(PrivatizerStrategy):
    name = "sparse"
    per_sample_activation_share = 1.0  # the hook engine's records
    config: SparseConfig
    supports_data_parallel = False  # noises outside noised_sum: one rank's noise would not be shared

    engine: HookEngine

    def __init__(self, config: SparseConfig, privacy):
        super().__init__(config, privacy)
        if config.selection not in SELECTIONS:
            raise ConfigurationError(f"privatizer.selection must be one of {SELECTIONS}, got {config.selection!r}")
        if not 0 < config.sparsity <= 1:
            raise ConfigurationError(f"privatizer.sparsity must lie in (0, 1], got {config.sparsity}")
        for key in ("clip2", "selection_clip", "svt_threshold"):
            if not getattr(config, key) > 0:
                raise ConfigurationError(f"privatizer.{key} must be positive, got {getattr(config, key)}")
        self.selections = 0
        """Selections drawn so far: each draws from its own key of the secret randomness, never replayed."""
        self.draw_epsilon: float | None = config.draw_epsilon
        self.layouts: list[_Layout] = []
        self.expected_batch_size: float | None = None
        self.last_selection: dict[str, Tensor] = {}

    # -- privacy ---------------------------------------------------------------------------------------------
    @property
    def num_coordinates(self) -> int:
        return sum(layout.rows * layout.cols for layout in self.layouts)

    @property
    def draws(self) -> int:
        return max(1, round(self.config.sparsity * self.num_coordinates))

    def _mechanism(self, sigma: float | None) -> Mechanism:
        q = self.privacy.sampling_rate
        if self.config.selection == "random":
            return SubsampledGaussian(q, sigma)
        if self.draw_epsilon is None:
            raise RuntimeError("the selection epsilon is not set: attach the model and call prepare first")
        return SubsampledSelectionGaussian(q, sigma, self.draw_epsilon, self.draws)

    def step_mechanisms(self, step: int) -> list[Mechanism]:
        return [self._mechanism(self.noise_multiplier)]

    def composition(self, noise_multiplier: float, steps: int) -> Composition:
        return [(self._mechanism(noise_multiplier), steps)]

    def prepare(self, model: nn.Module, steps: int, delta: float, epsilon: float | None, accountant: Any) -> None:
        """Calibrate each draw's epsilon so that the selection alone spends its budget (the noise gets the rest)."""
        self._layout(model)
        if self.config.selection == "random" or self.config.draw_epsilon is not None:
            return
        budget = self.config.selection_epsilon
        if budget is None:
            if epsilon is None or not 0 < self.config.selection_share < 1:
                raise ConfigurationError(
                    "privatizer=sparse needs a selection budget: privatizer.selection_epsilon, "
                    "privatizer.draw_epsilon, or privacy.epsilon with privatizer.selection_share in (0, 1)"
                )
            budget = self.config.selection_share * epsilon
        q = self.privacy.sampling_rate

        def spent(draw_epsilon: float) -> float:
            mechanism = SubsampledSelectionGaussian(q, None, draw_epsilon, self.draws)
            return accountant.epsilon([(mechanism, steps)], delta).epsilon

        low, high = budget * 1e-7, budget
        if spent(high) <= budget:
            self.draw_epsilon = high
            return
        while high / low > 1 + self.config.calibration_tolerance:
            mid = math.sqrt(low * high)
            low, high = (mid, high) if spent(mid) <= budget else (low, mid)
        self.draw_epsilon = low

    def privacy_report(self, steps: int, delta: float) -> dict[str, Any]:
        """The paper's Theorem 3 bound for this run (its sigma is in units of min(S1/b, S2))."""
        b = self.expected_batch_size
        report: dict[str, Any] = {
            "selection": self.config.selection,
            "draw_epsilon": self.draw_epsilon if self.config.selection != "random" else 0.0,
            "selection_draws": self.draws,
            "num_coordinates": self.num_coordinates,
        }
        if b:
            s1 = self.privacy.clip_norm
            paper_sigma = self.noise_multiplier * min(s1 / b, 2 * self.config.clip2) / min(s1 / b, self.config.clip2)
            draws = 0 if self.config.selection == "random" else self.draws
            bound = theorem3_bound(self.privacy.sampling_rate, steps, paper_sigma, self.draw_epsilon or 0.0, draws,
                                   delta)
            report.update({"theorem3_epsilon": bound.epsilon, "theorem3_assumption_holds": bound.assumption_holds,
                           "theorem3_lemmas_hold": bound.lemmas_hold})
        return report

    # -- training --------------------------------------------------------------------------------------------

    def _layout(self, model: nn.Module) -> None:
        self.layouts, offset = [], 0
        for param in trainable_parameters(model).values():
            rows = param.shape[0] if param.dim() > 0 else 1
            self.layouts.append(_Layout(param, offset, rows, param.numel() // rows))
            offset += param.numel()

    def preflight(self, model: nn.Module, optimizer_config: Any | None) -> None:
        super().preflight(model, optimizer_config)
        if optimizer_config is not None:
            _check_optimizer(optimizer_config)
        check_hook_engine(model)
        self._layout(model)
        if self.draws >= self.num_coordinates:
            raise ConfigurationError(
                f"privatizer.sparsity={self.config.sparsity:g} selects all {self.num_coordinates:,} coordinates of "
                f"this model each step: nothing is sparse, and the selection spends privacy for nothing; lower "
                f"privatizer.sparsity, or run privatizer=vanilla")

    def method_details(self, model: nn.Module) -> dict[str, Any]:
        return {"coordinates": self.num_coordinates, "selected_per_step": self.draws,
                "selected_fraction": self.draws / self.num_coordinates if self.num_coordinates else None}

    def attach(self, model: nn.Module) -> None:
        self.engine = HookEngine(model, self.checks)
        self._layout(model)
        self._names = list(trainable_parameters(model))
        self._rows: dict[str, list[Tensor]] = {}
        self._values: dict[str, list[Tensor]] = {}
        self._pending: dict[nn.Parameter, tuple[Tensor, Tensor]] = {}

    def configure_optimizer(self, model: nn.Module, optimizer_config: Any) -> Optimizer:
        _check_optimizer(optimizer_config)
        params = [layout.param for layout in self.layouts]
        if optimizer_config.name == "adam" and not self.config.lazy_adam:
            return torch.optim.Adam(params, optimizer_config.lr, tuple(optimizer_config.betas), optimizer_config.eps)
        return SelectedCoordinateOptimizer(
            params, optimizer_config.name, optimizer_config.lr, tuple(optimizer_config.betas), optimizer_config.eps,
        )

    def accumulate(self, model: nn.Module, task: Task, batch: Batch, ctx: StepContext) -> tuple[float, dict]:
        if batch_size_of(batch) == 0:
            return 0.0, {"batch_size": 0.0}
        sites, factors, norms, losses = self.engine.clipped_sites(task, batch, self.privacy.clip_norm)
        for name, group in sites.items():
            for site in group:
                if isinstance(site, EmbeddingSite):  # the samples' rows only
                    rows, values = site.weighted_rows(factors)
                else:
                    values = site.weighted_sum(factors)
                    values = values.reshape(values.shape[0] if values.dim() > 0 else 1, -1)
                    rows = torch.arange(values.shape[0], device=values.device)
                self._rows.setdefault(name, []).append(rows)
                self._values.setdefault(name, []).append(values)
        return float(losses.sum()), clipping_stats(norms, self.privacy.clip_norm)

    def _touched(self, expected_batch_size: float) -> tuple[np.ndarray, Tensor]:
        """Sorted global indices of the coordinates the batch touched, and the averaged gradient there (CPU)."""
        indices, values = [], []
        for layout, name in zip(self.layouts, self._names, strict=True):
            if name not in self._rows:
                continue
            rows, inverse = torch.unique(torch.cat(self._rows[name]), return_inverse=True)
            summed = torch.zeros(len(rows), layout.cols, dtype=torch.float64, device=rows.device)
            summed.index_add_(0, inverse, torch.cat(self._values[name]).to(torch.float64))
            flat = layout.offset + rows.unsqueeze(1) * layout.cols + torch.arange(layout.cols, device=rows.device)
            indices.append(flat.reshape(-1).cpu())
            values.append(summed.reshape(-1).cpu() / expected_batch_size)
        self._rows, self._values = {}, {}
        if not indices:
            return np.empty(0, dtype=np.int64), torch.empty(0, dtype=torch.float64)
        return torch.cat(indices).numpy(), torch.cat(values)

    def select(self, touched: np.ndarray, average: Tensor, expected_batch_size: float) -> np.ndarray:
        """Sorted global indices of the k selected coordinates."""
        p, k = self.num_coordinates, self.draws
        rng = self.privacy.randomness.numpy_generator("selection", self.selections)
        self.selections += 1
        s0 = self.config.selection_clip
        score_bound = min(s0, self.privacy.clip_norm / expected_batch_size)  # sensitivity of a score
        scores = average.abs().clamp(max=s0).numpy()
        if self.config.selection == "random":
            return np.sort(uniform_untouched(np.empty(0, dtype=np.int64), p, k, rng))
        if self.config.selection == "exponential":
            utility = self.draw_epsilon * scores / (2 * score_bound)
            return exponential_top_k(touched, utility, p, k, rng)
        return sparse_vector(
            touched, scores, p, k, self.config.svt_threshold * s0, 2 * score_bound / self.draw_epsilon,
            4 * score_bound / self.draw_epsilon, rng,
        )

    def finalize(self, model: nn.Module, ctx: StepContext) -> None:
        b = self.expected_batch_size = ctx.expected_batch_size
        touched, average = self._touched(b)
        selected = self.select(touched, average, b)
        delta = torch.zeros(len(selected), dtype=torch.float64)
        if len(touched):
            position = np.searchsorted(touched, selected).clip(max=len(touched) - 1)
            hit = touched[position] == selected
            delta[torch.as_tensor(hit)] = average[torch.as_tensor(position[hit])]
        delta = delta * min(1.0, self.config.clip2 / (float(delta.norm()) + 1e-12))
        std = self.noise_multiplier * min(self.privacy.clip_norm / b, 2 * self.config.clip2)
        noisy = delta + self.noise.normal_like(delta, std)
        self.last_selection = {"indices": torch.as_tensor(selected), "clipped": delta, "noisy": noisy}
        selected_t = torch.as_tensor(selected)
        self._pending = {}
        for layout in self.layouts:
            mask = (selected_t >= layout.offset) & (selected_t < layout.offset + layout.rows * layout.cols)
            if mask.any():
                device = layout.param.device
                self._pending[layout.param] = ((selected_t[mask] - layout.offset).to(device),
                                               noisy[mask].to(device, layout.param.dtype))

    def apply_update(self, optimizer: Optimizer) -> None:
        """Through optimizer.step(), so that Lightning's global_step (and max_steps) count sparse steps too."""
        inner = getattr(optimizer, "optimizer", optimizer)
        if isinstance(inner, SelectedCoordinateOptimizer):
            inner.pending = self._pending
        else:  # dense Adam: the released update, zero off the selection
            for layout in self.layouts:
                layout.param.grad = torch.zeros_like(layout.param, memory_format=torch.contiguous_format)
            for param, (index, values) in self._pending.items():
                param.grad.view(-1)[index] = values
        optimizer.step()
        self._pending = {}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "selections": self.selections, "draw_epsilon": self.draw_epsilon}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.selections = state["selections"]
        self.draw_epsilon = state["draw_epsilon"]
