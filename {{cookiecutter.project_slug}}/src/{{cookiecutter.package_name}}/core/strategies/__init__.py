"""Strategies: how a run spreads over devices. Only this package asks which one runs.

`single` (one device), `ddp` (one process per device), `spmd` (one process per host,
data parallel over a mesh) and `fsdp` (parameters, gradients and optimizer state sharded
over a mesh; with a `tensor` axis, two ways: see core/sharding.py). `auto` picks `single`
for one device and `spmd` for more.
"""

from __future__ import annotations

from ..runtime import RuntimeConfigError
from ..sharding import parse_mesh
from .base import CPU_EMULATED_DEVICES, SingleDevice, Strategy
from .ddp import DataParallelProcesses
from .fsdp import FullyShardedDataParallel
from .interface import blocks_of
from .spmd import SpmdDataParallel

__all__ = [
    "CHOICES",
    "CPU_EMULATED_DEVICES",
    "STRATEGIES",
    "DataParallelProcesses",
    "FullyShardedDataParallel",
    "SingleDevice",
    "SpmdDataParallel",
    "Strategy",
    "blocks_of",
    "parse_mesh",
    "resolve",
]

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls
    for cls in (SingleDevice, DataParallelProcesses, SpmdDataParallel, FullyShardedDataParallel)
}
CHOICES = ("auto", *STRATEGIES)


def resolve(
    name: str, accelerator: str, devices: int | None, core: int | None = None, mesh: str = ""
) -> Strategy:
    """The strategy object for a request; RuntimeConfigError says what to change."""
    if name not in CHOICES:
        raise RuntimeConfigError(f"unknown strategy {name!r}: choose one of {', '.join(CHOICES)}")
    if name == "auto":
        # SPMD, not ddp, on a multi-device host: one process (one model copy in host RAM)
        # drives every chip, and it is the mode FSDP builds on.
        name = "single" if devices == 1 else "spmd"
    return STRATEGIES[name].create(accelerator, devices, core, mesh)
