"""Strategies: how a run spreads over devices. Only this package asks which one runs.

`single` (one device), `ddp` (one process per device, DistributedDataParallel) and `fsdp`
(FSDP2 over a device mesh of one process per device; with a `tensor` axis, DTensor's
tensor parallelism too). `auto` picks `single` for one device of one host and `ddp` for
more (several devices, or the hosts of a pod).
"""

from __future__ import annotations

from .. import runtime
from ..runtime import RuntimeConfigError
from ..sharding import parse_mesh
from .base import CPU_EMULATED_DEVICES, SingleDevice, Strategy
from .ddp import DataParallelProcesses
from .fsdp import FullyShardedDataParallel
from .interface import blocks_of

__all__ = [
    "CHOICES",
    "CPU_EMULATED_DEVICES",
    "STRATEGIES",
    "DataParallelProcesses",
    "FullyShardedDataParallel",
    "SingleDevice",
    "Strategy",
    "blocks_of",
    "parse_mesh",
    "resolve",
]

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (SingleDevice, DataParallelProcesses, FullyShardedDataParallel)
}
CHOICES = ("auto", *STRATEGIES)


def resolve(
    name: str, accelerator: str, devices: int | None, core: int | None = None, mesh: str = ""
) -> Strategy:
    """The strategy object for a request; RuntimeConfigError says what to change."""
    if name == "spmd":
        raise RuntimeConfigError(
            "strategy 'spmd' is torch_xla's (one process drives every device of a host); "
            "torch_tpu runs one process per device: use --strategy ddp or fsdp"
        )
    if name not in CHOICES:
        raise RuntimeConfigError(f"unknown strategy {name!r}: choose one of {', '.join(CHOICES)}")
    if name == "auto":
        # One device of one host alone; several, or the hosts of a pod, one process each.
        name = "single" if devices == 1 and runtime.hosts().count == 1 else "ddp"
    return STRATEGIES[name].create(accelerator, devices, core, mesh)
