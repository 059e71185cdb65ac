"""FSDP2 (`torch.distributed.fsdp.fully_shard`): every rank holds one shard of each parameter (a DTensor split along
dim 0 as torch.chunk splits it) and its own Poisson share of the batch.

FSDP2 gathers a layer's parameters for its forward and backward, so each sample's gradient, and with it its norm, is
formed whole on the rank that holds the sample: clipping needs no norm from another rank. The clipped sums then meet
in one reduce-scatter that leaves each rank the global sum's rows of its own shard, and each rank adds noise to that
shard only, drawn from a key of its own (the step and its rank): every coordinate is noised once, by exactly one rank,
and no two ranks draw the same noise. The key holds no state a checkpoint must carry, and a step replayed after a
crash redraws the noise it drew before for the batch it drew before (the sampler is keyed by the step too).

Every rank must run the same collectives in the same order, so a sharded step runs its forward and backward even on
an empty local batch and as many micro-batches as the rank with the most.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Shard

from dpbench.core.errors import ConfigurationError, UnsupportedModelError
from dpbench.privacy.randomness import PrivacyRandomness


def unsupported_sharding(strategy_name: str) -> ConfigurationError:
    return ConfigurationError(
        f"privatizer={strategy_name} does not support trainer.strategy=fsdp yet (vanilla and grape do): run it with "
        "trainer.strategy=ddp or on one device"
    )


def is_sharded(tensor: Tensor) -> bool:
    return isinstance(tensor, DTensor)


def sharded_model(model: nn.Module) -> bool:
    return any(is_sharded(p) for p in model.parameters())


def shard_rows(param: DTensor) -> tuple[int, int]:
    """This rank's rows of `param` (FSDP2's default placement: Shard(0), torch.chunk's split)."""
    if tuple(param.placements) != (Shard(0),):
        raise UnsupportedModelError(
            f"a parameter is sharded as {param.placements}, not FSDP2's default Shard(0): dpbench noises each rank's "
            "rows of dim 0; shard with fully_shard's default shard_placement_fn"
        )
    mesh = param.device_mesh
    rows, world, rank = param.shape[0], mesh.size(), mesh.get_local_rank()
    size = -(-rows // world)  # torch.chunk: ceil(rows / world) rows per rank, the last ones fewer or none
    start = min(rank * size, rows)
    return start, min(start + size, rows)


def shard_of_sum(total: Tensor, param: DTensor) -> Tensor:
    """This rank's rows of the sum over ranks of `total` (each rank's full-shaped clipped sum), a plain tensor."""
    mesh = param.device_mesh
    world = mesh.size()
    size = -(-param.shape[0] // world)
    padded = total.new_zeros((size * world, *total.shape[1:]))
    padded[: total.shape[0]] = total
    shard = total.new_empty((size, *total.shape[1:]))
    dist.reduce_scatter_single(shard, padded, group=mesh.get_group())
    start, stop = shard_rows(param)
    return shard[: stop - start]


def shard_noise(randomness: PrivacyRandomness, step: int, param: DTensor, device: torch.device):
    """The draws for this rank's shards at `step`: keyed by (step, rank), one key per rank and step."""
    return randomness.draws("sharded_noise", step, param.device_mesh.get_rank(), device=device)


def as_sharded_grad(local: Tensor, param: DTensor) -> DTensor:
    """`local` (this rank's rows) as a gradient laid out like `param`."""
    return DTensor.from_local(local, param.device_mesh, param.placements, shape=param.shape, stride=param.stride(),
                              run_check=False)
