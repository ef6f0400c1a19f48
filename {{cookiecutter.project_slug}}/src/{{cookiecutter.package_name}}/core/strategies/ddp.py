"""ddp: one process per device, gradients all-reduced by XLA collectives (TPU only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import runtime
from ..runtime import RuntimeConfigError
from .base import Strategy


class DataParallelProcesses(Strategy):
    """One replica per device, each in its own process, every process on its own shard.

    Kept for TPU users who want it explicitly; `auto` picks spmd on a multi-device
    host. XLA:CPU has no multi-process collectives, so off-TPU it runs one replica.
    """

    name = "ddp"

    @classmethod
    def check_request(
        cls, accelerator: str, devices: int | None, core: int | None, mesh: str
    ) -> None:
        super().check_request(accelerator, devices, core, mesh)
        if accelerator == "cpu" and devices != 1:
            raise RuntimeConfigError(
                "XLA:CPU has no multi-process collectives, so strategy 'ddp' cannot use "
                f"{devices} devices here: use --strategy spmd to emulate them in one process"
            )

    def processes(self) -> int:
        return runtime.world_size()

    def _replicated(self) -> bool:
        return self.processes() > 1

    def spawns(self) -> bool:
        return self.devices != 1

    def launch(
        self, fn: Callable[..., Any], args: tuple[Any, ...] = (), start_method: str = "spawn"
    ) -> Any:
        """Spawn one process per local device (one replica runs here, returning its result)."""
        if not self.spawns():
            return super().launch(fn, args, start_method)
        runtime.configure(self.accelerator, cpu_devices=1)
        if runtime.runtime_initialized():
            raise RuntimeConfigError(
                "the XLA runtime is already initialized in this process, so it cannot "
                "spawn replicas: do not touch an XLA device before launching "
                "(in a notebook, restart the kernel)"
            )
        import torch_xla

        return torch_xla.launch(_replica_entry, args=(fn, args), start_method=start_method)

    def is_master(self) -> bool:
        return runtime.global_ordinal() == 0

    def is_local_master(self) -> bool:
        return runtime.local_ordinal() == 0

    def data_layout(self) -> tuple[int, int]:
        return runtime.world_size(), runtime.global_ordinal()

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        if self._replicated():
            import torch_xla.core.xla_model as xm

            xm.reduce_gradients(optimizer)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if not self._replicated():
            return tensor
        import torch_xla.core.xla_model as xm

        reduced = xm.all_reduce(xm.REDUCE_SUM, tensor)
        assert isinstance(reduced, torch.Tensor)
        return reduced

    def agree_any(self, flag: bool) -> bool:
        if not self._replicated():
            return flag
        import torch_xla.core.xla_model as xm

        return bool(xm.mesh_reduce("agree_any", int(flag), max))

    def barrier(self, tag: str) -> None:
        if self._replicated():
            import torch_xla.core.xla_model as xm

            xm.rendezvous(tag)


def _replica_entry(index: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    fn(*args)
