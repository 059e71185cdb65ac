"""The one layout step every forward-mode rule's vmap rule takes: JL's r directions in front of each tangent."""

from __future__ import annotations

from torch import Tensor


def directions_first(tangent: Tensor | None, dim: int | None, count: int) -> Tensor | None:
    """A vmapped tangent with its `count` directions in front (expanded, not copied, when it has none)."""
    if tangent is None:
        return None
    return tangent.movedim(dim, 0) if dim is not None else tangent.expand(count, *tangent.shape)
