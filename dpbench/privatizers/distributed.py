"""Data-parallel pieces: every rank clips its own samples; the sums meet in one all-reduce; rank 0 alone adds noise.

So a logical step is noised exactly once whatever the number of ranks, and every rank ends with the same update.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from dpbench.privacy.randomness import PrivacyRandomness


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def all_reduce_sum(tensor: Tensor) -> Tensor:
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def any_rank(flag: bool, device: torch.device) -> bool:
    """Whether `flag` holds on any rank: decisions every rank must take together (a check, a stop)."""
    if not is_distributed():
        return flag
    tensor = torch.tensor([float(flag)], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


def broadcast_randomness(randomness: PrivacyRandomness) -> None:
    """Rank 0's secret root on every rank (each rank drew its own from the OS at start)."""
    if is_distributed():
        state = [randomness.root]
        dist.broadcast_object_list(state, src=0)
        randomness.root = state[0]
