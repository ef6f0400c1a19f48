"""The torch_xla backend's strategy base: one device in one process, XLA:CPU off a TPU."""

from __future__ import annotations

from torch import nn

from . import interface
from .interface import blocks_to_recompute

# XLA:CPU emulates this many devices when `--devices all` is asked for off-TPU.
CPU_EMULATED_DEVICES = 8


class Strategy(interface.Strategy):
    """A strategy of the torch_xla backend: XLA devices, one process per host (spmd, fsdp)
    or per device (ddp)."""

    mesh_strategies = ("spmd", "fsdp")
    many_device_strategies = ("spmd", "fsdp", "ddp")
    cpu_kind = "XLA:CPU"

    def recompute_blocks(self, model: nn.Module, block_class: type[nn.Module] | None) -> int:
        return checkpoint_blocks(model, block_class)


class SingleDevice(interface.OneDevice, Strategy):
    """One device in one process: one TPU core (or chip), or XLA:CPU."""


def checkpoint_blocks(model: nn.Module, block_class: type[nn.Module] | None) -> int:
    """Recompute each block's activations in the backward pass instead of storing them."""
    from torch_xla.distributed.fsdp import checkpoint_module

    blocks = blocks_to_recompute(model, block_class)
    for block in blocks:
        checkpoint_module(block)
    return len(blocks)
