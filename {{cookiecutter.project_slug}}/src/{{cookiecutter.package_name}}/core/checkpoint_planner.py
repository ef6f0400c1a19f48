"""A save planner that writes every shard once, for tensors split over some mesh axes and
whole over the others.

torch_xla 2.9's SPMDSavePlanner makes a write item for every local shard of a sharded
tensor, replicas included. A partially replicated tensor (split over `fsdp` and whole over
`tensor` or `data`: every parameter the fsdp rule lays out on a 2D mesh, and every one on
`data=2,fsdp=4`) then has overlapping chunks, and torch.distributed.checkpoint leaves the
tensor out of the checkpoint without an error: resuming finds it missing, and an export
would have nothing to export. This planner keeps replica 0 of each shard (one writer per
chunk, on whichever host holds it) and is what torch_xla's CheckpointManager saves with.
Loading needs no change: every device reads its shard, replicas alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch_xla
import torch_xla.experimental.distributed_checkpoint as xc
from torch.distributed.checkpoint.planner import SavePlan
from torch_xla.experimental.distributed_checkpoint._helpers import _CpuShards


class ShardOnceSavePlanner(xc.SPMDSavePlanner):  # type: ignore[misc]
    """SPMDSavePlanner without the write items of replicas other than 0."""

    def create_local_plan(self) -> SavePlan:
        plan = super().create_local_plan()
        replicas = {fqn: _replica_ids(value) for fqn, value in self.sharded_state_dict.items()}
        kept = [item for item in plan.items if _first_replica(item.index, replicas)]
        return dataclasses.replace(plan, items=kept)


def _first_replica(index: Any, replicas: dict[str, list[int]]) -> bool:
    """True for an unsharded item or a shard of replica 0 (the one that writes it)."""
    if index.fqn not in replicas or index.index is None:
        return True
    return replicas[index.fqn][index.index] == 0


def _replica_ids(value: Any) -> list[int]:
    """The replica id of each local shard, in the order the write items number them."""
    if isinstance(value, _CpuShards):  # async saves: shards already copied to the host
        return [shard.replica_id for shard in value.shards]
    indices = torch_xla._XLAC._get_local_shard_replica_and_indices([value.global_tensor])[0]
    return [replica for replica, _ in indices]


def install() -> None:
    """Make torch_xla's CheckpointManager (and anyone else) save with this planner."""
    xc.SPMDSavePlanner = ShardOnceSavePlanner  # type: ignore[misc]
