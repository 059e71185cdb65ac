"""Per-sample gradient engine on module hooks: one forward, one backward to the layer outputs only.

The backward asks autograd for the gradients of the recorded layer *outputs*, so it never computes the (unused)
batch weight gradients; per-sample norms and the clipped sum are then formed from the recorded activations (ghost
norms where cheaper). Covers Linear, Conv1d/2d, Embedding, LayerNorm, GroupNorm, the recurrent layers and the Hugging
Face layers named in layers.NAMED_HANDLERS (Conv1D, ViT embeddings, OPT positions).

It fails closed. An output is differentiated at the graph edge it had when recorded, so an in-place op on it
(nn.ReLU(inplace=True), a residual `out += x`) changes nothing; a recorded input changed in place is refused. Before
its first step, and again during training (check_schedule.py), the engine compares a few samples' per-sample gradients
of the step's batch (in training mode, dropout off) with per-example backward passes (verify.py), and the training step
after a check checks that every parameter getting a gradient was seen by a hook: the hooks' assumptions (sample-major
inputs, parameters used inside their module's call only, no mixing of samples) are checked rather than trusted.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.graph import GradientEdge, get_gradient_edge
from torch.utils._pytree import TreeSpec, tree_flatten, tree_map, tree_unflatten

from dpbench.core.errors import UnsupportedModelError
from dpbench.core.tasks import Batch, Task, batch_size_of
from dpbench.privatizers import distributed
from dpbench.privatizers.clipping import FactorFn, clip_factors
from dpbench.privatizers.per_sample.base import ClippedSum, refuse_sample_mixing_layers, trainable_parameters
from dpbench.privatizers.per_sample.check_schedule import CheckSchedule
from dpbench.privatizers.per_sample.construction import PROVEN, require_fast_path
from dpbench.privatizers.per_sample.layers import SiteMap, handler_for, input_for
from dpbench.privatizers.per_sample.norms import group_norm_sq, total_norm_sq
from dpbench.privatizers.per_sample.precision import model_forward, widened
from dpbench.privatizers.per_sample.rnn_gate_forward import GateRecord, gate_forward
from dpbench.privatizers.per_sample.rnn_recompute import refuse_unsupported_call
from dpbench.privatizers.per_sample.rnn_unrolled import RECURRENT_LAYERS
from dpbench.privatizers.per_sample.sites import Site
from dpbench.privatizers.per_sample.verify import (
    Deviation,
    as_trained_without_dropout,
    describe,
    deviation,
    merge,
    parameters_reached,
    per_example_deviations,
    sample_mismatch,
)
from dpbench.privatizers.sharding import sharded_model


class PerSampleMismatch(UnsupportedModelError):
    """A check during training found per-sample gradients that differ from per-example passes: the steps before it
    were clipped with them."""

    def __init__(self, message: str, step: int, parameters: list[str]):
        super().__init__(message)
        self.step, self.parameters = step, parameters


NOT_HOOKABLE = (
    "make the model call each layer on batch-first inputs and use parameters only through their layer, or use "
    "privatizer.engine=functorch (or auto) where the privatizer has one"
)


SHARDED_UNCHECKED = (
    "FSDP2: a per-example pass would reduce-scatter its gradient over the ranks, so no reference is formed; the model "
    "is proven per-sample by construction before every step (construction.py), as the hook engine requires"
)


def unsupported_modules(model: nn.Module) -> list[str]:
    """Modules holding trainable parameters that the hook engine has no rule for."""
    names = []
    for name, module in model.named_modules():
        owns_trainable = any(p.requires_grad for p in module.parameters(recurse=False))
        if owns_trainable and handler_for(module) is None:
            names.append(f"{name or '<root>'} ({type(module).__name__})")
    return names


def _unflatten_tokens(x: Tensor, g, batch: int) -> tuple[Tensor, object]:
    """A 2-D (B*T, d) input is tokens flattened sample-major (HF OPT's MLP: reshape(-1, d)): back to (B, T, d).

    A time-major flattening looks the same; the first batch's verification tells them apart.
    """
    if x.dim() == 2 and isinstance(g, Tensor) and x.shape[0] != batch and x.shape[0] % batch == 0:
        return x.reshape(batch, -1, x.shape[-1]), g.reshape(batch, -1, g.shape[-1])
    return x, g


def _rebased_edge(output: Tensor) -> GradientEdge | None:
    """Where the output's gradient is read if an in-place op later rebases it: its own edge, or for a view that
    reshapes a whole tensor (nn.Linear on (B, T, d)) its base's; None for other views, whose edge autograd drops."""
    if not output._is_view():
        return get_gradient_edge(output)
    base = output._base
    if base.requires_grad and base.numel() == output.numel() and base.is_contiguous() and output.is_contiguous():
        return get_gradient_edge(base)
    return None


@dataclass
class Call:
    """One recorded forward of a hooked module: what its rule reads, and what must not change before the backward."""

    module: nn.Module
    input: Any
    input_version: int | None
    outputs: list[Any]
    """The output's leaves (nn.LSTM returns (output, (h_n, c_n))), rebuilt with `spec`."""
    spec: TreeSpec
    versions: list[int | None]
    edges: list[GradientEdge | None]


def check_hook_engine(model: nn.Module) -> None:
    """What the hook engine refuses of a model: also asked before the run (PrivatizerStrategy.preflight)."""
    refuse_sample_mixing_layers(model)
    require_fast_path(model, "the hook engine")
    unsupported = unsupported_modules(model)
    if unsupported:
        raise UnsupportedModelError(
            "the hook engine has no per-sample rule for: " + ", ".join(unsupported)
            + "; use privatizer.engine=functorch (vmap) for this model"
        )


class HookEngine:
    """Records (module, input, output) during the forward pass; reads output gradients after it."""

    materialize = False
    """True: every per-sample gradient is built as a (B, *shape) tensor before clipping (see MaterializedEngine)."""

    def __init__(self, model: nn.Module, checks: CheckSchedule | None = None):
        check_hook_engine(model)
        self.model = model
        self.params = trainable_parameters(model)
        self.names = {p: name for name, p in self.params.items()}
        self.module_names = {module: name or "<root>" for name, module in model.named_modules()}
        self.checks = checks if checks is not None else CheckSchedule()
        self.checks.engine = {"name": "hooks", "why": PROVEN}
        self._calls: list[Call] = []
        self._recording = False
        hooked = [
            module for module in model.modules()
            if handler_for(module) is not None and any(p.requires_grad for p in module.parameters(recurse=False))
        ]
        self._handles = [module.register_forward_hook(self._record, with_kwargs=True) for module in hooked]
        self._recurrent = [module for module in hooked if isinstance(module, RECURRENT_LAYERS)]
        self._gates: dict[nn.Module, tuple[list[Tensor], GateRecord]] = {}

    def _record(self, module: nn.Module, args: tuple, kwargs: dict, output: Tensor | tuple) -> None:
        if self._recording and torch.is_grad_enabled():
            self._calls.append(self._call(module, args, kwargs, output))

    def _call(self, module: nn.Module, args: tuple, kwargs: dict, output: Tensor | tuple) -> Call:
        if kwargs:  # self.fc(input=x): the rules read the call's positional arguments
            bound = inspect.signature(module.forward).bind(*args, **kwargs)
            args, kwargs = bound.args, bound.kwargs
        gates = self._gates.pop(module, None)
        if gates is not None:  # gate_forward ran: the sites read the input gates' gradients
            leaves, spec = tree_flatten(gates[0])
            return Call(module, gates[1], None, leaves, spec, [t._version for t in leaves],
                        [get_gradient_edge(t) for t in leaves])
        refuse_unsupported_call(module, args, kwargs)
        x = input_for(module)(module, *args)
        leaves, spec = tree_flatten(output)
        tensors = [leaf if isinstance(leaf, Tensor) and leaf.requires_grad else None for leaf in leaves]
        return Call(
            module, x, x._version if isinstance(x, Tensor) else None, leaves, spec,
            [None if t is None else t._version for t in tensors],
            [None if t is None else _rebased_edge(t) for t in tensors],
        )

    def name(self, module: nn.Module) -> str:
        return f"{self.module_names.get(module, '?')} ({type(module).__name__})"

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()

    def _forward(self, task: Task, batch: Batch) -> Tensor:
        """The recorded forward; recurrent layers run rnn_gate_forward's recurrence (unless a forward is already set
        on the module), so that their gate gradients come from the step's one backward."""
        self._calls, self._gates = [], {}
        self._recording = True
        swapped = [module for module in self._recurrent if "forward" not in vars(module)]
        for module in swapped:
            module.forward = functools.partial(gate_forward, module, self._gates)
        try:
            with model_forward():
                return task.per_sample_loss(self.model, batch)
        finally:
            self._recording = False
            for module in swapped:
                del module.forward

    def _sites(self, task: Task, batch: Batch, dense: bool) -> tuple[dict[str, list[Site]], Tensor]:
        """Every rank checks when any rank's schedule asks (and stops or switches when any rank's check fails). A
        batch of one sample is its own per-example pass: exact, and not checked (it could not show mixing)."""
        require_fast_path(self.model, "the hook engine", task)  # every step: the model may have changed since
        now = {name: id(p) for name, p in trainable_parameters(self.model).items()}
        if now != {name: id(p) for name, p in self.params.items()}:  # a parameter replaced, frozen or unfrozen
            changed = sorted(set(now.items()) ^ {(name, id(p)) for name, p in self.params.items()})
            raise UnsupportedModelError(
                f"the trainable parameters changed after the hook engine was built "
                f"({', '.join(sorted({name for name, _ in changed}))}): set requires_grad and replace parameters "
                "before make_private or the run starts, or use privatizer.engine=functorch (or auto)")
        checked = None
        device = next(iter(self.params.values())).device  # where the model is now (Lightning moves it after attach)
        if sharded_model(self.model):
            self.checks.off = SHARDED_UNCHECKED
        elif distributed.any_rank(self.checks.due(), device):
            checked, bad = self._verify(task, batch, dense) if batch_size_of(batch) > 1 else (None, {})
            if distributed.any_rank(bool(bad), device):
                raise self._mismatch(bad)
        sites, losses, _ = self._collect(task, batch, dense, checked)
        dormant = [name for name in self.checks.dormant if name in sites]
        if dormant:
            moved = torch.stack([group_norm_sq(sites[name]).sum() for name in dormant]).gt(0).tolist()
            self.checks.saw_gradients({name for name, nonzero in zip(dormant, moved, strict=True) if nonzero})
        return sites, losses

    def _collect(
        self, task: Task, batch: Batch, dense: bool, checked: Counter | None
    ) -> tuple[dict[str, list[Site]], Tensor, Counter]:
        """One hooked forward and backward: the sites by parameter name, the losses and the hooked calls per module.

        `checked`: the calls of the checked pass, which the training step after a check must repeat.
        """
        if batch_size_of(batch) == 0 and sharded_model(self.model):
            return self._join_the_gathers(task, batch)
        losses = self._forward(task, batch)
        calls, self._calls = self._calls, []
        called = self._check_calls(losses, calls, checked)
        output_grads = self._output_grads(losses, calls)
        calls_per_param: dict[nn.Parameter, int] = defaultdict(int)
        for call in calls:
            for p in call.module.parameters(recurse=False):
                calls_per_param[p] += 1
        sites: dict[str, list[Site]] = defaultdict(list)
        site_maps = [
            self.call_sites(call.module, call.input, g, losses.shape[0],
                            dense or any(calls_per_param[p] > 1 for p in call.module.parameters(recurse=False)))
            for call, g in zip(calls, output_grads, strict=True)
        ]
        for site_map in [*site_maps, *self._streamed_sites()]:
            for param, site in site_map.items():
                sites[self.names[param]].append(site)
        return sites, losses.detach(), called

    def _join_the_gathers(self, task: Task, batch: Batch) -> tuple[dict[str, list[Site]], Tensor, Counter]:
        """An empty share of a sharded step: this rank's forward and backward run on one constant sample (a model
        may not take an empty batch: OPT's attention reshape cannot), so that it joins the other ranks' parameter
        gathers, as the same backward as theirs; no site, loss or gradient of it is kept, and the sample is no
        record's (its values are constants)."""
        inputs, targets = batch
        one = (tree_map(lambda t: torch.ones((1, *t.shape[1:]), dtype=t.dtype, device=t.device), inputs),
               torch.zeros((1, *targets.shape[1:]), dtype=targets.dtype, device=targets.device))
        losses = self._forward(task, one)
        calls, self._calls = self._calls, []
        called = self._check_calls(losses, calls, None)
        self._output_grads(losses, calls)
        return {}, losses.detach()[:0], called

    def _streamed_sites(self) -> list[SiteMap]:
        """Sites formed during the backward pass (GRAPE's projected layers)."""
        return []

    def _check_calls(self, losses: Tensor, calls: list[Call], checked: Counter | None) -> Counter:
        """Every step, O(calls): no recorded input changed in place. The training step after a check: every parameter
        that gets a gradient was hooked, and the hooks saw the calls of the checked pass. Returns the calls per
        module."""
        for call in calls:
            if call.input_version is not None and call.input._version != call.input_version:
                raise UnsupportedModelError(
                    f"the input of {self.name(call.module)} was modified in place after the layer read it, so its "
                    "per-sample gradients would be formed from the modified values: make that operation out-of-place "
                    "(e.g. nn.ReLU(inplace=False)) or use privatizer.engine=functorch"
                )
        called = Counter(call.module for call in calls)
        if checked is None:
            return called
        covered = {p for call in calls for p in call.module.parameters(recurse=False)}
        missed = [self.names[p] for p in parameters_reached(losses) if p in self.names and p not in covered]
        if missed:
            raise UnsupportedModelError(
                f"{', '.join(sorted(missed))} get gradients outside any call of their module (e.g. "
                "F.linear(x, layer.weight)), which no hook sees: call the module itself, or use "
                "privatizer.engine=functorch (or auto)"
            )
        changed = sorted({self.name(m) for m in called.keys() | checked.keys() if called[m] != checked[m]})
        if changed:
            raise UnsupportedModelError(
                f"while training, the hooks see other calls of {', '.join(changed)} than in the checked pass "
                "(gradient checkpointing or layer drop hides or skips layers), so the check does not cover the "
                "training step: turn that off, or use privatizer.engine=functorch (or auto)"
            )
        return called

    def _output_grads(self, losses: Tensor, calls: list[Call], anchors: Iterable = ()) -> list:
        """Gradients of the recorded outputs at their recorded edges, from one backward that computes no weight
        gradient (`anchors`: further tensors the backward must reach, their gradients dropped)."""
        targets: list[Tensor | GradientEdge] = []
        for call in calls:
            for output, version, edge in zip(call.outputs, call.versions, call.edges, strict=True):
                if version is None:
                    continue
                if output._version == version:
                    targets.append(output)
                elif edge is not None:
                    targets.append(edge)
                else:
                    raise UnsupportedModelError(
                        f"the output of {self.name(call.module)} is a view that an in-place operation modified, so "
                        "its gradient cannot be read where the layer produced it: make that operation out-of-place "
                        "(e.g. nn.ReLU(inplace=False)) or use privatizer.engine=functorch"
                    )
        anchors = list(anchors)
        if not targets and not anchors:
            return [tree_unflatten([None] * len(call.outputs), call.spec) for call in calls]
        grads = iter(torch.autograd.grad(losses.sum(), [*targets, *anchors], allow_unused=True))
        per_call = []
        for call in calls:
            leaf_grads = []
            for output, version in zip(call.outputs, call.versions, strict=True):
                g = None if version is None else next(grads)
                if version is not None:
                    g = torch.zeros_like(output) if g is None else g.reshape(output.shape)
                leaf_grads.append(g)
            per_call.append(tree_unflatten(leaf_grads, call.spec))
        return per_call

    def call_sites(self, module: nn.Module, x: Tensor, g, batch: int, dense: bool) -> SiteMap:
        """Sites of one recorded call, after checking that the call saw the whole batch. An empty batch (run only so
        that a sharded model's ranks gather parameters together) has none."""
        if batch == 0:
            return {}
        if isinstance(x, GateRecord):
            if x.batch != batch:
                raise UnsupportedModelError(
                    f"{self.name(module)} was called on {x.batch} sequences, not the batch's {batch} samples, so the "
                    "hooks cannot tell the samples apart: pass per-sample inputs, or use privatizer.engine=functorch"
                )
            return self.module_sites(module, widened(x), widened(g), dense)
        x, g = _unflatten_tokens(x, g, batch)
        batch_dim = 1 if getattr(module, "batch_first", True) is False else 0
        if x.shape[batch_dim] != batch:
            raise UnsupportedModelError(
                f"{self.name(module)} was called on an input whose batch dimension has {x.shape[batch_dim]} rows, "
                f"not the batch's {batch} samples (e.g. position ids of shape (1, T) broadcast over the batch, or a "
                "time-major or concatenated input), so the hooks cannot tell the samples apart: pass per-sample "
                "(B, ...) inputs (dpbench's SequenceClassifier gives BERT, DistilBERT and GPT-2 (B, T) position "
                "ids), or use privatizer.engine=functorch (or auto)"
            )
        return self.module_sites(module, widened(x.detach()), widened(g), dense)

    def module_sites(self, module: nn.Module, x: Tensor, g: Tensor, dense: bool) -> SiteMap:
        """One recorded call's sites, by parameter: the layer's rule (strategies may transform them, e.g. GRAPE)."""
        return handler_for(module)(module, x, g, dense)

    def reference(self, param: nn.Parameter, grad: Tensor) -> Tensor:
        """A per-example gradient in the space this engine's sites live in (GRAPE: projected)."""
        return grad

    def _verify(self, task: Task, batch: Batch, dense: bool) -> tuple[Counter, dict[str, float]]:
        """A few samples' gradients and norms from the sites of the real batch against per-example backward passes,
        each sample alone. In training mode with dropout off, one extra hooked pass of the batch's shapes (a T == B
        coincidence shows), no larger than a step; returns its hooked calls per module and the parameters that
        differ (relative errors)."""
        started = time.perf_counter()
        with as_trained_without_dropout(self.model) as draws:
            sites, losses, called = self._collect(task, batch, dense, None)
            if draws.drawn():
                raise UnsupportedModelError(
                    f"the model draws random numbers in training mode besides dropout ({draws.describe()}: "
                    "stochastic depth, a noise layer?), so the hook engine's per-sample gradients cannot be checked "
                    "against each sample's own pass: turn that randomness off (e.g. drop_path_rate=0), or use "
                    "privatizer.engine=functorch (or auto), whose per-sample gradients are each sample's own by "
                    "construction"
                )
            norms = {name: group_norm_sq(group).sqrt() for name, group in sites.items()}
            _drop_nonfinite(sites, sum(norms.values(), torch.zeros(losses.shape[0], device=losses.device)))
            bad: dict[str, float] = {}
            for i in self.checks.samples(losses.shape[0]):
                one_hot = torch.zeros(losses.shape[0], device=losses.device)
                one_hot[i] = 1
                bad = merge(bad, self._sample_mismatch(task, batch, sites, norms, i, one_hot))
        nonzero = torch.stack([n.nan_to_num(1.0).sum() for n in norms.values()]).gt(0).tolist() if norms else []
        self.checks.checked(
            time.perf_counter() - started,
            set(self.params) - {name for name, moved in zip(norms, nonzero, strict=True) if moved},
        )
        return called, bad

    def _mismatch(self, bad: dict[str, float]) -> UnsupportedModelError:
        """The refusal (at a run's first check) or the stop (later: steps were clipped with these gradients)."""
        found = describe(bad) if bad else "some parameters (found by another rank's check)"
        if len(self.checks.checked_steps) <= 1:
            return UnsupportedModelError(
                f"the hook engine's per-sample gradients of {found} differ from per-example backward passes "
                "on this batch: a parameter used outside its module's call (a tied output layer), an input that is "
                "not sample-major (time-major, reshape(-1, d) of a (T, B, d) tensor, torch.cat of samples through "
                "one layer), a module whose forward is not its type's, or a layer that mixes the samples of a batch "
                f"(e.g. batch statistics while training): {NOT_HOOKABLE}"
            )
        step = self.checks.checked_steps[-1]
        return PerSampleMismatch(
            f"at step {step} the hook engine's per-sample gradients of {found} differ from per-example "
            f"backward passes (they matched at steps {self.checks.checked_steps[:-1]}: a layer that was inactive or "
            f"had zero gradient then, or one that mixes samples, is now in use). The steps before {step} (and any "
            f"earlier micro-batch of step {step}) were clipped with these gradients, so the epsilon reported for them "
            "is not a guarantee. "
            f"{NOT_HOOKABLE}", step, sorted(bad),
        )

    def _sample_mismatch(
        self, task: Task, batch: Batch, sites: dict[str, list[Site]], norms: dict[str, Tensor], sample: int,
        one_hot: Tensor,
    ) -> dict[str, float]:
        """Parameters whose per-sample gradient is not the sample's own (verify.sample_mismatch)."""
        return sample_mismatch(
            lambda copies: self._deviations(task, batch, sites, norms, sample, one_hot, copies), one_hot.shape[0])

    def _deviations(
        self, task: Task, batch: Batch, sites: dict[str, list[Site]], norms: dict[str, Tensor], sample: int,
        one_hot: Tensor, copies: int,
    ) -> dict[str, Deviation]:
        """Sample `sample`'s per-parameter deviation from its own forward and backward pass (in this engine's space),
        one parameter at a time (`one_hot` selects the sample from the sites)."""
        def compare(name: str, param: nn.Parameter, grad: Tensor | None) -> Deviation:
            reference = self.reference(param, torch.zeros_like(param) if grad is None else grad)
            group = sites.get(name)
            if not group:
                return deviation(torch.zeros_like(reference), 0.0, reference)
            return deviation(sum(site.weighted_sum(one_hot) for site in group), float(norms[name][sample]), reference)

        try:
            return per_example_deviations(self.model, task, batch, sample, self.params, compare, copies)
        except RuntimeError as error:  # e.g. a model that cannot run a batch of one
            raise UnsupportedModelError(
                f"per-example backward passes through this model failed ({error}), so the hook engine's per-sample "
                f"gradients cannot be checked: {NOT_HOOKABLE}"
            ) from error

    def per_sample_gradients(self, task: Task, batch: Batch) -> dict[str, Tensor]:
        """Materialized (B, *shape) gradients: for tests and for strategies that transform them."""
        sites, _ = self._sites(task, batch, dense=True)
        return {name: sum(site.materialize() for site in group) for name, group in sites.items()}

    def clipped_sum(
        self, task: Task, batch: Batch, clip_norm: float, factor_fn: FactorFn = clip_factors
    ) -> ClippedSum:
        """sum_i factor_i g_i; factor_fn gives the per-sample factors (default: clip to C; D2P2: automatic)."""
        sites, factors, norms, losses = self.clipped_sites(task, batch, clip_norm, factor_fn)
        grads = {name: sum(site.weighted_sum(factors) for site in group) for name, group in sites.items()}
        for name, param in self.params.items():
            if name not in grads:  # not reached by this batch's forward pass: its gradient is zero
                grads[name] = torch.zeros(param.shape, dtype=param.dtype, device=param.device)
        return ClippedSum(grads=grads, norms=norms, losses=losses)

    def clipped_sites(
        self, task: Task, batch: Batch, clip_norm: float, factor_fn: FactorFn = clip_factors
    ) -> tuple[dict[str, list[Site]], Tensor, Tensor, Tensor]:
        """(sites by parameter name, clipping factors, per-sample norms, losses), non-finite samples zeroed.

        For strategies that sum the clipped gradients their own way (sparse: touched embedding rows only). The norms
        are accumulated in the sites' precision (float64 for a float64 model), at least float32.
        """
        sites, losses = self._sites(task, batch, dense=self.materialize)
        zero = torch.zeros(losses.shape[0], device=losses.device)
        norms = total_norm_sq(list(sites.values()), zero).sqrt()
        factors = factor_fn(norms, clip_norm)
        _drop_nonfinite(sites, norms)
        return sites, factors, norms, losses


class MaterializedEngine(HookEngine):
    """privatizer.engine=materialized: the baseline the JL and GRAPE papers measured against (Opacus's default,
    TF-Privacy): all per-sample gradients held at once, embedding rows over the whole vocabulary included. Exact like
    the hook engine, which it is with ghost norms and sparse embedding sites turned off."""

    materialize = True


def _drop_nonfinite(sites: dict[str, list[Site]], norms: Tensor) -> None:
    """Zero the samples whose norm is NaN or inf (the step drops them), so that they poison no weighted sum."""
    bad = ~torch.isfinite(norms)
    if bad.any():
        for group in sites.values():
            for site in group:
                site.zero_samples(bad)

