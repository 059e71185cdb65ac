"""Turn one recorded layer call (module, input, output gradient) into per-parameter per-sample sites."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpbench.core.errors import UnsupportedModelError
from dpbench.privatizers.per_sample.fastest import batch_bucket, fastest
from dpbench.privatizers.per_sample.sites import DenseSite, EmbeddingSite, OuterProductSite, Site

SiteMap = dict[nn.Parameter, Site]


def _prefer_ghost(positions: int, fan_in: int, fan_out: int) -> bool:
    """Ghost norm costs ~T^2 per sample, the dense per-sample gradient in*out (Bu et al.'s mixed rule)."""
    return 2 * positions * positions < fan_in * fan_out


def _affine_sites(module: nn.Module, weight_grad: Tensor | None, bias_grad: Tensor) -> SiteMap:
    sites: SiteMap = {}
    if module.weight is not None and module.weight.requires_grad and weight_grad is not None:
        sites[module.weight] = DenseSite(weight_grad)
    if module.bias is not None and module.bias.requires_grad:
        sites[module.bias] = DenseSite(bias_grad)
    return sites


def outer_product_site(a: Tensor, g: Tensor, shape: tuple[int, int], dense: bool) -> Site:
    """g_i = sum_t G_it A_it^T of shape (out, in): ghost (from A and G) or materialized, whichever is cheaper."""
    site = OuterProductSite(a, g, torch.Size(shape))
    ghost = not dense and _prefer_ghost(a.shape[1], a.shape[2], g.shape[2])
    return site if ghost else DenseSite(site.materialize())


def _matrix_sites(module: nn.Module, a: Tensor, g: Tensor, dense: bool) -> SiteMap:
    """Sites of a weight applied as a matrix at T positions: a (B,T,in), g (B,T,out)."""
    sites: SiteMap = {}
    if module.weight.requires_grad:
        sites[module.weight] = outer_product_site(a, g, module.weight.shape, dense)
    if module.bias is not None and module.bias.requires_grad:
        sites[module.bias] = DenseSite(g.sum(1))
    return sites


def matrix_factors(module: nn.Module, x: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """(rows, cols), each (B, T, .), with the per-sample weight gradient sum_t rows_t cols_t^T (weight-shaped).

    nn.Linear stores (out, in), so rows are the output gradients; HF Conv1D stores (in, out): rows are the inputs.
    """
    batch = x.shape[0]
    a, g = x.reshape(batch, -1, x.shape[-1]), g.reshape(batch, -1, g.shape[-1])
    return (g, a) if isinstance(module, nn.Linear) else (a, g)


def linear_sites(module: nn.Module, x: Tensor, g: Tensor, dense: bool) -> SiteMap:
    """nn.Linear and Hugging Face's Conv1D (GPT-2), which is a Linear with a transposed weight."""
    rows, cols = matrix_factors(module, x, g)
    sites: SiteMap = {}
    if module.weight.requires_grad:
        sites[module.weight] = outer_product_site(cols, rows, module.weight.shape, dense)
    if module.bias is not None and module.bias.requires_grad:
        sites[module.bias] = DenseSite(g.reshape(x.shape[0], -1, g.shape[-1]).sum(1))
    return sites


def _patches(x: Tensor, kernel, stride, dilation) -> Tensor:
    """(B, L, C*kh*kw) receptive fields of a padded input as a strided view copied once: faster than F.unfold."""
    x = x.contiguous()
    batch, channels, height, width = x.shape
    out_h = (height - dilation[0] * (kernel[0] - 1) - 1) // stride[0] + 1
    out_w = (width - dilation[1] * (kernel[1] - 1) - 1) // stride[1] + 1
    s_b, s_c, s_h, s_w = x.stride()
    view = x.as_strided(
        (batch, out_h, out_w, channels, kernel[0], kernel[1]),
        (s_b, stride[0] * s_h, stride[1] * s_w, s_c, dilation[0] * s_h, dilation[1] * s_w),
    )
    return view.reshape(batch, out_h * out_w, channels * kernel[0] * kernel[1])


def _grouped_sites(module: nn.Conv1d | nn.Conv2d, patches: Tensor, g: Tensor) -> SiteMap:
    """groups > 1: each group's output channels see only its input channels. Materialized: grouped (e.g. depthwise)
    weights are small next to the activations."""
    batch, positions, _ = patches.shape
    a = patches.reshape(batch, positions, module.groups, -1)  # patches are channel-major: groups are contiguous
    per_group = g.reshape(batch, positions, module.groups, -1)
    weight_grad = torch.einsum("blgo,blgi->bgoi", per_group, a).reshape(batch, *module.weight.shape)
    return _affine_sites(module, weight_grad, g.sum(1))


def patch_conv_sites(module: nn.Conv1d | nn.Conv2d, x: Tensor, g: Tensor, dense: bool) -> SiteMap:
    """Any stride, dilation, groups, numeric or 'same' padding and padding mode: the input is padded as the layer pads
    it (nn.Conv's own padding amounts), then every weight is an outer product of patches and output gradients (ghost
    norm or materialized, as for a linear layer)."""
    mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
    x = F.pad(x, module._reversed_padding_repeated_twice, mode=mode)
    kernel, stride, dilation = module.kernel_size, module.stride, module.dilation
    if isinstance(module, nn.Conv1d):  # a 1 x k image
        x, kernel, stride, dilation = x.unsqueeze(2), (1, *kernel), (1, *stride), (1, *dilation)
    patches = _patches(x, kernel, stride, dilation)  # (B, L, in*k)
    g = g.reshape(g.shape[0], g.shape[1], -1).transpose(1, 2)  # (B, L, out)
    if module.groups > 1:
        return _grouped_sites(module, patches, g)
    return _matrix_sites(module, patches, g, dense)


def grouped_conv_sites(module: nn.Conv1d | nn.Conv2d, x: Tensor, g: Tensor, dense: bool) -> SiteMap:
    """Every sample's weight gradient at once, materialized, as the weight gradient of one convolution with the batch
    folded into the channels (B * groups groups): the framework's own convolution kernel (oneDNN, cuDNN) instead of a
    patch copy and a batched matmul."""
    batch, spatial = x.shape[0], len(module.kernel_size)
    padding = module.padding
    if module.padding_mode != "zeros" or isinstance(padding, str):
        mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
        x, padding = F.pad(x, module._reversed_padding_repeated_twice, mode=mode), (0,) * spatial
    weight_grad = None
    if module.weight.requires_grad:
        shape = (batch * module.out_channels, *module.weight.shape[1:])  # only its shape is read
        _, folded, _ = torch.ops.aten.convolution_backward(
            g.reshape(1, -1, *g.shape[2:]), x.reshape(1, -1, *x.shape[2:]), x.new_empty(shape), None,
            module.stride, padding, module.dilation, False, (0,) * spatial, batch * module.groups,
            (False, True, False),
        )
        weight_grad = folded.view(batch, *module.weight.shape)
    return _affine_sites(module, weight_grad, g.flatten(2).sum(2))


def _site_work(rule: Callable[..., SiteMap], module: nn.Module, x: Tensor, g: Tensor, dense: bool) -> Callable:
    """What a step does with a rule's sites: build them, their norms and a weighted sum."""
    def run() -> None:
        ones = torch.ones(x.shape[0], device=x.device, dtype=x.dtype)
        for site in rule(module, x, g, dense).values():
            site.norm_sq()
            site.weighted_sum(ones)
    return run


def conv_sites(module: nn.Conv1d | nn.Conv2d, x: Tensor, g: Tensor, dense: bool) -> SiteMap:
    """The patch rule or the grouped-convolution rule, whichever ran faster on this layer's shapes (both exact).
    The grouped rule materializes every per-sample gradient, so it is a candidate only where those take at most
    twice the memory of the patch matrix that the patch rule copies (out_channels / groups <= 2 positions)."""
    positions = math.prod(g.shape[2:])
    rules = {"patches": patch_conv_sites}
    if module.weight.requires_grad and (dense or module.out_channels // module.groups <= 2 * positions):
        rules["grouped"] = grouped_conv_sites
    key = (type(module).__name__, module.in_channels, module.out_channels, module.kernel_size, module.stride,
           module.padding, module.dilation, module.groups, module.padding_mode, module.bias is not None,
           module.weight.requires_grad, tuple(x.shape[1:]), batch_bucket(x.shape[0]), str(x.dtype), x.device.type,
           dense, torch.get_num_threads())
    candidates = {name: _site_work(rule, module, x, g, dense) for name, rule in rules.items()}
    return rules[fastest(key, candidates, x.device)](module, x, g, dense)


def embedding_sites(module: nn.Embedding, ids: Tensor, g: Tensor, dense: bool) -> SiteMap:
    if module.scale_grad_by_freq or module.sparse or module.max_norm is not None:
        raise UnsupportedModelError(f"{module}: scale_grad_by_freq, sparse and max_norm embeddings are unsupported")
    if not module.weight.requires_grad:
        return {}
    batch = ids.shape[0]
    ids = ids.reshape(batch, -1)
    g = g.reshape(batch, ids.shape[1], -1)
    if module.padding_idx is not None:  # PyTorch gives the padding row no gradient
        g = g * (ids != module.padding_idx).unsqueeze(-1)
    site = EmbeddingSite(ids, g, module.num_embeddings)
    return {module.weight: DenseSite(site.materialize()) if dense else site}


def _unit_affine(x: Tensor, shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """Weight one and bias zero, which leave a normalisation's output exactly as without them: on CPU the kernels
    with an affine part run twice as fast (LayerNorm over (500, 17, 64): 0.31 against 0.63 ms, one thread)."""
    return x.new_ones(shape), x.new_zeros(shape)


def layer_norm_sites(module: nn.LayerNorm, x: Tensor, g: Tensor, dense: bool) -> SiteMap:
    normalized = F.layer_norm(x, module.normalized_shape, *_unit_affine(x, module.normalized_shape), eps=module.eps)
    reduce = tuple(range(1, x.dim() - len(module.normalized_shape)))
    weight_grad = (g * normalized).sum(reduce) if reduce else g * normalized
    return _affine_sites(module, weight_grad, g.sum(reduce) if reduce else g)


def group_norm_sites(module: nn.GroupNorm, x: Tensor, g: Tensor, dense: bool) -> SiteMap:
    normalized = F.group_norm(x, module.num_groups, *_unit_affine(x, (x.shape[1],)), eps=module.eps)
    reduce = tuple(range(2, x.dim()))  # none for a (B, C) input: sum(()) would reduce every dimension
    return _affine_sites(module, (g * normalized).sum(reduce) if reduce else g * normalized,
                         g.sum(reduce) if reduce else g)


def vit_embeddings_sites(module: nn.Module, x: Tensor, g: Tensor, dense: bool) -> SiteMap:
    """HF ViTEmbeddings' raw parameters: output = cat(cls, patches) + position, so cls gets G[:, 0], position G.

    The patch projection inside is a Conv2d with its own rule. Dropout on the output would hide the mask the
    position gradient went through, so it must be off.
    """
    if module.training and module.dropout.p > 0:
        raise UnsupportedModelError("ViT embeddings with dropout: set model.hidden_dropout to 0 for per-sample hooks")
    if module.mask_token is not None and module.mask_token.requires_grad:
        raise UnsupportedModelError("ViT embeddings with a trainable mask token are unsupported: freeze it")
    if module.position_embeddings.shape[1] != g.shape[1]:
        raise UnsupportedModelError("ViT position embeddings interpolated to another image size are unsupported")
    sites: SiteMap = {}
    if module.cls_token.requires_grad:
        sites[module.cls_token] = DenseSite(g[:, None, :1])
    if module.position_embeddings.requires_grad:
        sites[module.position_embeddings] = DenseSite(g.unsqueeze(1))
    return sites


def opt_position_ids(module: nn.Embedding, attention_mask: Tensor, past_key_values_length: int = 0,
                     position_ids: Tensor | None = None) -> Tensor:
    """The ids HF OPTLearnedPositionalEmbedding looks up: the given position ids, else the mask's running count."""
    if position_ids is None:
        position_ids = (attention_mask.cumsum(1) * attention_mask - 1).long()[:, past_key_values_length:]
    return position_ids + module.offset


def first_input(module: nn.Module, *args) -> Tensor:
    return args[0]


LAYER_HANDLERS: dict[type[nn.Module], Callable[[nn.Module, Tensor, Tensor, bool], SiteMap]] = {
    nn.Linear: linear_sites,
    nn.Conv1d: conv_sites,
    nn.Conv2d: conv_sites,
    nn.Embedding: embedding_sites,
    nn.LayerNorm: layer_norm_sites,
    nn.GroupNorm: group_norm_sites,
}


NAMED_HANDLERS: dict[str, Callable[[nn.Module, Tensor, Tensor, bool], SiteMap]] = {
    "transformers.pytorch_utils.Conv1D": linear_sites,
    "transformers.models.vit.modeling_vit.ViTEmbeddings": vit_embeddings_sites,
    "transformers.models.opt.modeling_opt.OPTLearnedPositionalEmbedding": embedding_sites,
}
"""Hugging Face layers by qualified name, so that dpbench does not import transformers to look them up."""

NAMED_INPUTS: dict[str, Callable[..., Tensor]] = {
    "transformers.models.opt.modeling_opt.OPTLearnedPositionalEmbedding": opt_position_ids,
}
"""What a rule reads as the layer's input when it is not the first argument, from the call's positional arguments."""


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def handler_for(module: nn.Module) -> Callable[[nn.Module, Tensor, Tensor, bool], SiteMap] | None:
    for cls in type(module).__mro__:
        named = NAMED_HANDLERS.get(_qualified(cls))
        if named is not None:
            return named
        if cls in LAYER_HANDLERS:
            return LAYER_HANDLERS[cls]
    return None


def input_for(module: nn.Module) -> Callable[..., Tensor]:
    """(module, *positional args of its call) -> the input its rule reads."""
    for cls in type(module).__mro__:
        named = NAMED_INPUTS.get(_qualified(cls))
        if named is not None:
            return named
    return first_input
