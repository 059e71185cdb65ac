"""The models on which JL's forward-mode rules are checked against a per-example loop, on the CPU
(tests/per_sample/test_jl_convs.py, test_jl_tangent_rules.py) and on the device (tests/training/test_cuda.py)."""

import torch
import torch.nn.functional as F
from torch import nn

TOKENS, FEATURES = 3, 5


class ConvNet(nn.Module):
    """Two convolutions (the first reads data, so its input has no tangent), tanh between, a linear head."""

    def __init__(self, dims: int, groups: int = 1, bias: bool = True, padding_mode: str = "zeros", dilation: int = 1,
                 frozen_weight: bool = False, frozen: bool = False):
        super().__init__()
        conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[dims]
        self.first = conv(2, 4, 3, padding="same" if dilation > 1 else 1, dilation=dilation, bias=bias,
                          padding_mode=padding_mode)
        self.second = conv(4, 6, 2, stride=2, groups=groups, bias=bias)
        self.head = nn.LazyLinear(3)
        if frozen_weight or frozen:
            self.second.weight.requires_grad_(False)
        if frozen:
            self.second.bias.requires_grad_(False)

    def forward(self, x):
        return self.head(torch.tanh(self.second(torch.tanh(self.first(x)))).flatten(1))


class Block(nn.Module):
    """A transformer block: a data-reading linear layer (no input tangent), LayerNorm, two-head attention (torch's
    rule, between linear layers that take the rule), GELU, residuals."""

    def __init__(self, bias: bool = True, affine: bool = True, norm_bias: bool = True, approximate: str = "none",
                 norm_over_tokens: bool = False, frozen: tuple[str, ...] = ()):
        super().__init__()
        self.embed = nn.Linear(FEATURES, 8, bias=bias)
        shape = (TOKENS, 8) if norm_over_tokens else (8,)
        self.norm = nn.LayerNorm(shape, elementwise_affine=affine, bias=norm_bias)
        self.query, self.key, self.value = (nn.Linear(8, 8, bias=bias) for _ in range(3))
        self.up = nn.Linear(8, 12, bias=bias)
        self.down = nn.Linear(12, 8, bias=bias)
        self.head = nn.Linear(8, 3)
        self.approximate = approximate
        for name in frozen:
            self.get_parameter(name).requires_grad_(False)

    def _attention(self, h):
        heads = [layer(h).unflatten(-1, (2, 4)).transpose(-2, -3) for layer in (self.query, self.key, self.value)]
        out = F.scaled_dot_product_attention(*heads)
        return out.transpose(-2, -3).flatten(-2)

    def forward(self, x):
        h = self.embed(x)
        normed = self.norm(h)
        if h.dim() == 3:
            h = h + self._attention(normed)
        h = h + self.down(F.gelu(self.up(normed), approximate=self.approximate))
        return self.head(h.mean(1) if h.dim() == 3 else h)


class SharedLayer(nn.Module):
    """One linear layer applied twice with an in-place activation between: a tangent that aliased a direction's
    storage would be written by the second call."""

    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        h = torch.relu_(self.shared(x))
        return self.head(h + self.shared(h))
