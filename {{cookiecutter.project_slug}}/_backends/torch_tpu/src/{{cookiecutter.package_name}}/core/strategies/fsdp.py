"""fsdp: parameters, gradients and optimizer state sharded by FSDP2, with a `tensor` axis
through DTensor's tensor parallelism, on a device mesh.

`mesh = "fsdp=4"`: `fully_shard` on every repeated block, on the embedding and the head,
and on the model (each process holds a quarter of every parameter, gathered for use);
`data=2,fsdp=2`: HSDP, replicas of a model sharded two ways; `fsdp=2,tensor=2`: a 2-D
mesh, the layers the sharding rules split over `tensor` run tensor-parallel
(`parallelize_module`: a rule splitting a Linear's output rows over `tensor` makes it
column-wise, its input columns row-wise; an Embedding the other way round; a LoRA layer's
adapters split to match its base), then FSDP2 shards everything over `fsdp`. FSDP2 shards
each parameter's first dimension: the rules' `fsdp` entries are the torch_xla backend's
layout and do not apply here; their `tensor` entries do.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .. import runtime, tying
from ..materialize import Source, on_meta, parameter_groups, whole
from ..runtime import RuntimeConfigError
from ..sharding import (
    BATCH_AXES,
    Rule,
    Spec,
    check_mesh_size,
    model_layout,
)
from . import interface
from .base import ProcessPerDevice
from .blocks import check_after
from .interface import blocks_of

AXES = ("data", "fsdp", "tensor")


class FullyShardedDataParallel(interface.OnMesh, ProcessPerDevice):
    """FSDP2 (and HSDP, and tensor parallelism) over a device mesh of the job's processes."""

    name = "fsdp"

    def __init__(
        self, accelerator: str, devices: int | None, core: int | None = None, mesh: str = ""
    ) -> None:
        super().__init__(accelerator, devices, core, mesh)
        self._groups: dict[int, Any] = {}  # tensor coordinate -> its data-parallel group

    def check_mesh(self) -> None:
        other = sorted(set(dict(self.mesh_request)) - set(AXES))
        if other:
            raise RuntimeConfigError(
                f"mesh axis {other[0]!r} is not offered by the torch_tpu backend: use "
                f"{', '.join(AXES)}"
            )
        super().check_mesh()
        if self.accelerator == "cpu" and self.devices is not None and not runtime.launched():
            check_mesh_size(self.mesh_request, self.devices)  # one host: known now

    def start(self) -> None:
        super().start()
        check_mesh_size(self.mesh_request, runtime.world_size())

    def mesh(self) -> Any:
        """The DeviceMesh of the job's processes (the `tpu` or `cpu` device type)."""
        if self._mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            shape = self.mesh_shape()
            self._mesh = init_device_mesh(
                runtime.device().type,
                tuple(size for _, size in shape),
                mesh_dim_names=tuple(axis for axis, _ in shape),
            )
        return self._mesh

    def tensor_size(self) -> int:
        return self.mesh_axes().get("tensor", 1)

    def local_heads(self, heads: int) -> int:
        # A tensor-parallel layer's projections give each process its share of the heads.
        return heads // self.tensor_size()

    # ---- data -----------------------------------------------------------------------
    def data_layout(self) -> tuple[int, int]:
        # `tensor` is the innermost axis: the processes of one tensor group read one batch.
        tensor = self.tensor_size()
        return runtime.world_size() // tensor, runtime.global_ordinal() // tensor

    # ---- model ------------------------------------------------------------------------
    def setup_model(
        self,
        model: nn.Module,
        block_class: type[nn.Module] | None = None,
        activation_checkpointing: bool = False,
        rules: Sequence[Rule] = (),
        source: Source | None = None,
    ) -> tuple[nn.Module, tying.TieReport]:
        """Move the model, split the rules' `tensor` layers, shard blocks and model (FSDP2),
        and check the ties held through it. A model built on the meta device is laid out
        there first; then each process allocates and reads its own shards from `source`."""
        from torch.distributed.fsdp import fully_shard

        meta = source is not None and on_meta(model)
        if not meta:
            report = tying.move_and_retie(model, runtime.device())
        specs = _specs(model, rules, self.mesh_axes())  # refuses rules that cannot apply
        if self.tensor_size() > 1:
            self._parallelize(model, blocks_of(model, block_class), specs)
        if activation_checkpointing:
            self.recompute_blocks(model, block_class)
        data_axes = tuple(axis for axis, _ in self.mesh_shape() if axis in BATCH_AXES)
        mesh = self.mesh()[data_axes] if len(self.mesh_shape()) > 1 else self.mesh()
        blocks = blocks_of(model, block_class)
        for unit in [*blocks, *_outer_units(model, blocks)]:
            fully_shard(unit, mesh=mesh)
        fully_shard(model, mesh=mesh)
        if meta:
            assert source is not None
            fill = functools.partial(self._fill_shards, model, source)
            report = tying.move_and_retie(model, runtime.device(), fill)
        self._data_groups()
        return model, check_after(model, report)

    def _fill_shards(self, model: nn.Module, source: Source) -> None:
        """Allocate every process's shards (FSDP2's `to_empty`) and read each from `source`;
        the buffers, built on the host with the model, keep their values."""
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        device = runtime.device()
        buffers = {name: buffer for name, buffer in model.named_buffers()}
        model.to_empty(device=device)
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(buffers[name])
            for names, param in parameter_groups(model):
                plain = self.plain_name(names[0])
                if isinstance(param, DTensor):
                    shape, offset = compute_local_shape_and_global_offset(
                        param.shape, param.device_mesh, param.placements
                    )
                    index = tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))
                    param.to_local().copy_(source.read(plain, index, param.dtype))
                else:
                    param.copy_(source.read(plain, whole(param.shape), param.dtype))

    def _parallelize(
        self, model: nn.Module, blocks: list[nn.Module], specs: dict[str, Spec]
    ) -> None:
        """Tensor parallelism of the blocks' layers the rules split over `tensor`.

        Only inside the repeated blocks, where each split layer's partner undoes the split
        (column-wise, then row-wise): the embedding and the head stay whole over `tensor`
        (FSDP2 shards them), so the loss sees whole logits and tied weights stay one.
        """
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        block_ids = {id(block) for block in blocks}
        names = {id(module): name for name, module in model.named_modules()}
        found = False
        for block in blocks:
            prefix = f"{names[id(block)]}."
            plan: dict[str, Any] = {}
            for name, module in block.named_modules():
                spec = specs.get(f"{prefix}{name}.weight")
                if spec is None or not any(_has_tensor(entry) for entry in spec):
                    continue
                if id(module) in block_ids - {id(block)}:
                    continue  # a nested block: parallelized as its own
                output_split = _has_tensor(spec[0])
                if isinstance(module, nn.Linear):
                    plan[name] = ColwiseParallel() if output_split else RowwiseParallel()
                    plan.update(_lora_plan(block, name, output_split))
                elif isinstance(module, nn.Embedding):
                    plan[name] = RowwiseParallel() if output_split else ColwiseParallel()
                else:
                    raise RuntimeConfigError(
                        f"a rule splits {prefix}{name}.weight over 'tensor', but "
                        f"{type(module).__name__} is neither a Linear nor an Embedding: only "
                        "those run tensor-parallel here"
                    )
            if plan:
                parallelize_module(block, self.mesh()["tensor"], plan)
                found = True
        if not found:
            raise RuntimeConfigError(
                f"the mesh has tensor={self.tensor_size()} but no rule splits a Linear of the "
                "model's repeated blocks over it: give sharding_rules that use 'tensor' (and a "
                "task block_class), or drop the axis"
            )

    def _data_groups(self) -> None:
        """One process group per tensor coordinate: the processes that read different data."""
        tensor = self.tensor_size()
        if tensor == 1 or self._groups:
            return
        import torch.distributed as dist

        world = runtime.world_size()
        for coordinate in range(tensor):
            ranks = [rank for rank in range(world) if rank % tensor == coordinate]
            self._groups[coordinate] = dist.new_group(ranks)
        mine = self._groups[runtime.global_ordinal() % tensor]
        runtime.set_data_group(mine, world // tensor)

    # ---- collectives ------------------------------------------------------------------
    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the processes that read different data (a tensor group reads one)."""
        if self.processes() == 1:
            return tensor
        import torch.distributed as dist

        reduced = tensor.clone()
        group = self._groups.get(runtime.global_ordinal() % self.tensor_size())
        dist.all_reduce(reduced, group=group)
        return reduced


def _outer_units(model: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
    """The embeddings and Linear layers outside the repeated blocks (a decoder's embedding
    and head), each an FSDP2 unit of its own, as torchtitan shards them: gathered for its
    own use and freed after it, where the model's own unit (what is left: norms) stays
    gathered from the forward to the backward pass. A layer sharing a parameter with
    another (a head tied to the embedding) stays in the model's unit."""
    inside = {id(m) for block in blocks for m in block.modules()}
    owners: dict[int, int] = {}  # parameter -> how many modules hold it
    for module in model.modules():
        for param in module.parameters(recurse=False):
            owners[id(param)] = owners.get(id(param), 0) + 1
    units: list[nn.Module] = []
    for module in model.modules():
        if module is model or id(module) in inside:
            continue
        if not isinstance(module, (nn.Embedding, nn.Linear)):
            continue
        own = list(module.parameters(recurse=False))
        if own and all(owners[id(param)] == 1 for param in own):
            units.append(module)
    return units


def _lora_plan(block: nn.Module, name: str, output_split: bool) -> dict[str, Any]:
    """The adapters of a peft LoRA layer whose `base_layer` (`name`) runs tensor-parallel,
    split to give the base's output layout: beside a column-wise base, B column-wise (its
    output rows split, A whole); beside a row-wise one, A row-wise (its input columns split,
    its output summed over `tensor`, B whole)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    layer_name, _, leaf = name.rpartition(".")
    if leaf != "base_layer":
        return {}
    side = "lora_B" if output_split else "lora_A"
    adapters = getattr(block.get_submodule(layer_name), side, None)
    if not isinstance(adapters, nn.ModuleDict):
        return {}
    style = ColwiseParallel if output_split else RowwiseParallel
    return {f"{layer_name}.{side}.{adapter}": style() for adapter in adapters}


def _has_tensor(entry: Any) -> bool:
    return entry == "tensor" or (isinstance(entry, tuple) and "tensor" in entry)


def _specs(model: nn.Module, rules: Sequence[Rule], mesh: dict[str, int]) -> dict[str, Spec]:
    """Each parameter's layout by the rules (every one of its names, for tied ones)."""
    specs = model_layout(model, rules, mesh)
    named = model.named_parameters(remove_duplicate=False)
    return {name: specs[id(param)] for name, param in named}
