"""fsdp: FSDPv2 over the SPMD mesh: parameters, gradients and optimizer state sharded.

With `mesh = "fsdp=8"` every device holds an eighth of the model; with
`data=2,fsdp=4` two data-parallel groups each shard the model four ways.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .. import runtime, tying
from ..runtime import RuntimeConfigError
from .base import blocks_of
from .spmd import SpmdDataParallel, state_tensors

# What FSDPv2 inserts into parameter names; checkpoints use the plain model's names.
WRAPPER_PREFIX = "_orig_module."


class FullyShardedDataParallel(SpmdDataParallel):
    """FSDPv2: parameters, gradients and optimizer state sharded over the `fsdp` axis."""

    name = "fsdp"
    sharded_axis = "fsdp"

    def setup_model(
        self,
        model: nn.Module,
        block_class: type[nn.Module] | None = None,
        activation_checkpointing: bool = False,
    ) -> tuple[nn.Module, tying.TieReport]:
        """Wrap each block (or, without a block class, the whole model) in FSDPv2."""
        from torch_xla.distributed.fsdp import checkpoint_module
        from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy
        from torch_xla.experimental.spmd_fully_sharded_data_parallel import (
            SpmdFullyShardedDataParallel as FSDPv2,
        )

        # FSDPv2's backward hooks see blocks whose inputs need no gradient; torch says so
        # once per block and run. The hooks still do their work.
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        # The hook on the whole model (an optimization barrier before the gradient sync)
        # cannot fire on a model that returns an output object, as transformers models do;
        # the blocks' own barriers, where the bulk of the gradients is, still do.
        warnings.filterwarnings("ignore", message="For backward hooks to be called")
        report = tying.move_and_retie(model, runtime.device())
        policy = None
        if block_class is not None and blocks_of(model, block_class):
            policy = functools.partial(
                transformer_auto_wrap_policy, transformer_layer_cls={block_class}
            )
        elif activation_checkpointing:
            raise RuntimeConfigError(
                "activation_checkpointing needs the task to name its repeated block "
                "(block_class), or a model built from a BlockStack"
            )

        def wrap_block(module: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
            if activation_checkpointing:
                module = checkpoint_module(module)
            return FSDPv2(module, *args, **kwargs)

        wrapped = FSDPv2(
            model,
            mesh=self.mesh(),
            shard_output=self._shard_output,
            auto_wrap_policy=policy,
            auto_wrapper_callable=wrap_block,
        )
        return wrapped, report

    def check_scan(self) -> None:
        raise RuntimeConfigError(
            "scan_layers does not run under fsdp with torch_xla 2.9 (its scan cannot trace "
            "FSDPv2-wrapped blocks): use --strategy single or spmd, or scan_layers = false"
        )

    def _shard_output(self, output: Any, mesh: Any) -> None:
        """Split the batch dimension of a module's output over the batch axes."""
        import torch_xla.distributed.spmd as xs

        tensor = _first_tensor(output)
        if tensor is not None and tensor.dim() > 0:
            xs.mark_sharding(tensor, mesh, (self.batch_axes(),) + (None,) * (tensor.dim() - 1))

    def place_optimizer_state(self, optimizer: torch.optim.Optimizer) -> None:
        import torch_xla.distributed.spmd as xs
        from torch_xla.experimental.spmd_fully_sharded_data_parallel import (
            _prepare_spmd_partition_spec,
        )

        # The rule FSDPv2 shards parameters by: a moment shaped like its parameter
        # lands on the same devices as the parameter.
        for tensor in state_tensors(optimizer):
            spec = _prepare_spmd_partition_spec(tensor, shard_maximal=True)
            xs.mark_sharding(tensor, self.mesh(), spec)

    def plain_name(self, name: str) -> str:
        return name.replace(WRAPPER_PREFIX, "")


def _first_tensor(output: Any) -> torch.Tensor | None:
    """The main tensor of a model output: itself, the first of a tuple, or `logits`."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):
        logits = output.get("logits")
        if isinstance(logits, torch.Tensor):
            return logits
        output = tuple(output.values())
    if isinstance(output, (list, tuple)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None
