"""`trainer.strategy=fsdp`: FSDP2 (`fully_shard`) through Lightning's ModelParallelStrategy, every rank a data-parallel
shard of the mesh (tensor parallelism 1). The privatizer's side (sums reduce-scattered, each shard noised once) is
dpbench.privatizers.sharding."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

FSDP = "fsdp"


def lightning_strategy(name: str, devices: Any, num_nodes: int) -> Any:
    """What Lightning gets for trainer.strategy: FSDP2 for `fsdp` (Lightning's own `fsdp` is FSDP1, whose flattened
    parameters no per-sample engine can see), the name itself otherwise."""
    if name != FSDP:
        return name
    ranks = devices * num_nodes if isinstance(devices, int) else "auto"
    return ModelParallelStrategy(data_parallel_size=ranks, tensor_parallel_size=1)


def shard(model: nn.Module, mesh: DeviceMesh) -> None:
    """fully_shard every module that holds trainable parameters of its own, then the root: each layer's parameters
    are gathered for its own forward and backward only."""
    for module in list(model.modules())[1:]:
        if any(p.requires_grad for p in module.parameters(recurse=False)):
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
