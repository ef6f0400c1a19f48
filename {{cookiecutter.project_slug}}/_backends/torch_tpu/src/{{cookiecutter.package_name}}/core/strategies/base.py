"""The torch_tpu backend's strategy base: one device in one process, and one process per
device that torchrun's launcher starts (ddp, fsdp)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .. import runtime
from ..runtime import RuntimeConfigError
from . import interface
from .blocks import CHECKPOINT_PREFIX, checkpoint_blocks
from .spawning import spawn

# `--devices all` off a TPU starts this many CPU processes.
CPU_EMULATED_DEVICES = 8


class Strategy(interface.Strategy):
    """A strategy of the torch_tpu backend: one process per device, in a process group."""

    mesh_strategies = ("fsdp",)
    many_device_strategies = ("ddp", "fsdp")

    # ---- launch -------------------------------------------------------------------
    def launch(
        self, fn: Callable[..., Any], args: tuple[Any, ...] = (), start_method: str = "spawn"
    ) -> Any:
        """Run `fn(*args)` here, or in one process per device that torchrun's launcher starts
        (when this process is not one torchrun started already); return process 0's result."""
        if self.spawns():
            runtime.configure(self.accelerator, tpu_core=self.core)
            return spawn(self, fn, args, start_method)
        return super().launch(fn, args, start_method)

    def returns_result(self) -> bool:
        """True: the launcher returns the first process's result, spawned or not."""
        return True

    def start(self) -> None:
        """Set-up in the process that trains, before any device tensor: its process group."""
        runtime.init_process_group()
        if runtime.accelerator() == "cpu":
            # Processes share the host's cores: one thread each keeps them from fighting.
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(local, 1)))

    # ---- processes and data -------------------------------------------------------
    def is_master(self) -> bool:
        return runtime.global_ordinal() == 0

    def is_local_master(self) -> bool:
        return runtime.local_ordinal() == 0

    # ---- model and optimizer state -----------------------------------------------
    def recompute_blocks(self, model: nn.Module, block_class: type[nn.Module] | None) -> int:
        return checkpoint_blocks(model, block_class)

    def check_scan(self) -> None:
        """Refuse scan_layers: it runs through torch_xla's scan, which this backend lacks."""
        raise RuntimeConfigError(
            "scan_layers runs blocks through torch_xla's scan, which the torch_tpu backend "
            "does not have: set scan_layers = false"
        )

    def plain_name(self, name: str) -> str:
        return name.replace(CHECKPOINT_PREFIX, "")

    # ---- collectives ------------------------------------------------------------------
    def processes(self) -> int:
        return runtime.world_size()


class SingleDevice(interface.OneDevice, Strategy):
    """One device in one process: one TPU chip, or the CPU."""


class ProcessPerDevice(Strategy):
    """A strategy with one process per device, started by torchrun (or by `launch`)."""

    def cpu_devices(self) -> int:
        """Processes on this host: the devices asked for, on a TPU all of the host's."""
        if self.devices:
            return self.devices
        if self.accelerator == "tpu":
            return runtime.devices_per_host(runtime.accelerator_type())
        return CPU_EMULATED_DEVICES

    def spawns(self) -> bool:
        if runtime.launched():
            return False
        return self.cpu_devices() > 1 or runtime.hosts().count > 1

    def data_layout(self) -> tuple[int, int]:
        return runtime.world_size(), runtime.global_ordinal()

    def start(self) -> None:
        super().start()
        runtime.set_data_group(None, runtime.world_size())

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.processes() == 1:
            return tensor
        import torch.distributed as dist

        reduced = tensor.clone()
        dist.all_reduce(reduced)
        return reduced
