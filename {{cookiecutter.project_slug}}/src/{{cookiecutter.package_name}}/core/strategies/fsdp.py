"""fsdp: parameters, gradients and optimizer state sharded over the mesh's `fsdp` axis.

The sharding plan with an `fsdp` axis: every parameter no rule names is split along its
largest dimension (the layout of torch_xla's FSDPv2), each repeated block's output is
pinned to the batch layout with an optimization barrier before its gradients are
reduced (what FSDPv2 does per wrapped block), and optimizer state follows its parameter.
`mesh = "fsdp=8"`: every device holds an eighth of the model; `data=2,fsdp=4`: two
data-parallel groups each shard it four ways; `fsdp=4,tensor=2`: the rules' matrices split
two ways for good and the rest four ways (`core/sharding.py`).
"""

from __future__ import annotations

from ..runtime import RuntimeConfigError
from .spmd import SpmdDataParallel


class FullyShardedDataParallel(SpmdDataParallel):
    """FSDP under SPMD: the plan whose default splits every parameter over `fsdp`."""

    name = "fsdp"
    sharded_axis = "fsdp"

    def check_scan(self) -> None:
        raise RuntimeConfigError(
            "scan_layers does not run under fsdp with torch_xla 2.9 (its scan cannot trace "
            "FSDPv2-wrapped blocks): use --strategy single or spmd, or scan_layers = false"
        )
