"""ddp: one process per device, the model replicated, gradients all-reduced by DDP."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from .. import tying
from ..materialize import Source
from ..sharding import Rule
from .base import ProcessPerDevice
from .blocks import check_after

DDP_PREFIX = "module."


class DataParallelProcesses(ProcessPerDevice):
    """One replica per device, each in its own process, every process on its own shard of
    the data: torch's DistributedDataParallel (collectives over the `"tpu"` process group on
    a TPU, `gloo` on the CPU stand-in)."""

    name = "ddp"

    def setup_model(
        self,
        model: nn.Module,
        block_class: type[nn.Module] | None = None,
        activation_checkpointing: bool = False,
        rules: Sequence[Rule] = (),
        source: Source | None = None,
    ) -> tuple[nn.Module, tying.TieReport]:
        """Move the model (a model built on the meta device: filled whole from `source`,
        a replica per process), keep its ties, wrap it in DDP (which reduces the
        gradients)."""
        report = self.move(model, block_class, activation_checkpointing, source)
        if self.processes() == 1:
            return model, report
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model)
        return wrapped, check_after(wrapped, report)

    def plain_name(self, name: str) -> str:
        name = name[len(DDP_PREFIX) :] if name.startswith(DDP_PREFIX) else name
        return super().plain_name(name)
