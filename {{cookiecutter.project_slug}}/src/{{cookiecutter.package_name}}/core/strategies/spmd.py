"""spmd: one process per host drives every local device over a device mesh.

Parameters are laid out by the sharding rules (`core/sharding.py`): with only a `data`
axis every parameter is replicated and each batch is split (data parallel); a `tensor`
axis splits the matrices the rules name; a `context` axis splits every sequence, its
tokens' activations pinned that way block by block. `fsdp` (fsdp.py) is the same with an
`fsdp` axis.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .. import runtime, tying
from ..materialize import Source, buffers_to, fill_parameters, on_meta, whole
from ..runtime import RuntimeConfigError
from ..sharding import (
    BATCH_AXES,
    SEQUENCE_AXIS,
    Rule,
    Spec,
    check_mesh_size,
    model_layout,
    over_slices,
    shard_shape,
    state_spec,
)
from . import interface
from .base import CPU_EMULATED_DEVICES, Strategy
from .interface import blocks_of


class SpmdDataParallel(interface.OnMesh, Strategy):
    """Data parallel under SPMD: the model replicated (but for what rules split), the batch
    sharded over the batch axes."""

    name = "spmd"
    sharded_axis = "data"

    def __init__(
        self, accelerator: str, devices: int | None, core: int | None = None, mesh: str = ""
    ) -> None:
        super().__init__(accelerator, devices, core, mesh)
        self.specs: dict[int, Spec] = {}  # id(parameter) -> its layout

    def check_mesh(self) -> None:
        axes = dict(self.mesh_request)
        if self.name == "spmd" and "fsdp" in axes:
            raise RuntimeConfigError(
                "a mesh with an 'fsdp' axis shards the model: use --strategy fsdp"
            )
        # A mesh of sequences alone (`context=8`) is data parallel over nothing: spmd's.
        if not (self.name == "spmd" and set(axes) == {SEQUENCE_AXIS}):
            super().check_mesh()
        if self.accelerator == "cpu" and self.devices is not None:
            check_mesh_size(self.mesh_request, self.devices)  # one host: known now

    # ---- launch -------------------------------------------------------------------
    def cpu_devices(self) -> int:
        return self.devices or CPU_EMULATED_DEVICES

    def start(self) -> None:
        """Turn SPMD on and check the host's devices and the mesh against the request."""
        import torch_xla.runtime as xr

        xr.use_spmd()
        found = runtime.addressable_device_count()
        if self.devices is not None and found != self.devices:
            raise RuntimeConfigError(
                f"asked for {self.devices} devices but this host has {found}: "
                "use --devices all or the host's device count"
            )
        check_mesh_size(self.mesh_request, runtime.global_device_count())
        over_slices(self.mesh_shape(), runtime.mesh_slice_count())  # refused here, not at first use

    def mesh(self) -> Any:
        """The device mesh; over several slices, torch_xla's hybrid mesh (see over_slices)."""
        if self._mesh is None:
            import numpy as np
            import torch_xla.distributed.spmd as xs

            shape = self.mesh_shape()
            names = tuple(axis for axis, _ in shape)
            slices = runtime.mesh_slice_count()
            if slices > 1:
                ici, dcn = over_slices(shape, slices)
                self._mesh = xs.HybridMesh(ici_mesh_shape=ici, dcn_mesh_shape=dcn, axis_names=names)
            else:
                sizes = tuple(size for _, size in shape)
                self._mesh = xs.Mesh(np.arange(int(np.prod(sizes))), sizes, names)
            xs.set_global_mesh(self._mesh)  # where kernels (core/attention.py) find it
        return self._mesh

    def batch_axes(self) -> Any:
        """The mesh axes a batch's first dimension is split over (None: not split)."""
        axes = tuple(axis for axis, size in self.mesh_shape() if axis in BATCH_AXES)
        return None if not axes else axes[0] if len(axes) == 1 else axes

    def token_spec(self, tensor: torch.Tensor) -> tuple[Any, ...]:
        """The layout of a batch-first tensor: its batch over the batch axes and, with a
        `context` axis, its second dimension (the tokens) over that."""
        spec: list[Any] = [self.batch_axes()] + [None] * (tensor.dim() - 1)
        if tensor.dim() > 1 and self.mesh_axes().get(SEQUENCE_AXIS, 1) > 1:
            spec[1] = SEQUENCE_AXIS
        return tuple(spec)

    def place_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """On the device, its rows over the batch axes and, for a [rows, heads, ...] tensor of
        a mesh with a `tensor` axis that divides the heads, its heads over `tensor`."""
        from .. import ops

        rows = math.prod(size for axis, size in self.mesh_shape() if axis in BATCH_AXES)
        if tensor.shape[0] % rows:
            raise RuntimeConfigError(
                f"{tensor.shape[0]} rows do not split over the mesh's batch axes "
                f"({rows} ways): use a multiple of {rows}"
            )
        placed = ops.upload(tensor)
        self.keep_rows(placed)
        return placed

    def keep_rows(self, tensor: torch.Tensor) -> None:
        import torch_xla.distributed.spmd as xs

        spec: list[Any] = [self.batch_axes()] + [None] * (tensor.dim() - 1)
        parts = self.mesh_axes().get("tensor", 1)
        if tensor.dim() == 4 and parts > 1 and tensor.shape[1] % parts == 0:
            spec[1] = "tensor"
        xs.mark_sharding(tensor, self.mesh(), tuple(spec))

    def settle(self, tensors: Sequence[torch.Tensor]) -> None:
        # A tensor uploaded without a sharding comes out of a graph replicated.
        import torch_xla

        for tensor in tensors:
            if not torch_xla._XLAC._get_xla_sharding_spec(tensor):
                self.keep_whole(tensor)

    def keep_whole(self, tensor: torch.Tensor) -> None:
        """Replicated over the mesh: reading a split tensor compiles a gather at every read."""
        import torch_xla.distributed.spmd as xs

        xs.mark_sharding(tensor, self.mesh(), (None,) * tensor.dim())

    # ---- processes and data -------------------------------------------------------
    def is_master(self) -> bool:
        return runtime.process_index() == 0

    def data_layout(self) -> tuple[int, int]:
        # One loader per host; each host's part of the batch is split over its devices.
        return runtime.process_count(), runtime.process_index()

    def local_batch_shards(self) -> int:
        # The batch is split over the batch axes alone: the devices of a `tensor` or
        # `context` group share their samples. Each host feeds its part of the shards.
        shards = math.prod(size for axis, size in self.mesh_shape() if axis in BATCH_AXES)
        return max(1, shards // runtime.process_count())

    def input_sharding(self, sample: Any) -> Any:
        import torch_xla.distributed.spmd as xs

        multi_host = runtime.process_count() > 1
        every_axis = tuple(axis for axis, _ in self.mesh_shape())
        partial = any(axis not in BATCH_AXES for axis in every_axis)

        def spec(tensor: torch.Tensor) -> Any:
            dims = self.token_spec(tensor)
            if tensor.dim() == 1 and partial:
                # torch_xla 2.9's ShardingSpec cannot replicate a 1-D tensor over the other
                # axes ("too many indices for tensor of dimension 1"): split it over all of
                # them instead; XLA moves the few values where they are used.
                dims = (every_axis,)
            return xs.ShardingSpec(self.mesh(), dims, minibatch=multi_host)

        if isinstance(sample, Mapping):
            return {key: spec(value) for key, value in sample.items()}
        ranks = {t.dim() for t in (sample if isinstance(sample, (list, tuple)) else [sample])}
        if len(ranks) != 1:
            raise ValueError("spmd batches of mixed-rank tensors must be dicts (one spec per key)")
        tensor = sample[0] if isinstance(sample, (list, tuple)) else sample
        return spec(tensor)

    # ---- model and optimizer state -----------------------------------------------
    def setup_model(
        self,
        model: nn.Module,
        block_class: type[nn.Module] | None = None,
        activation_checkpointing: bool = False,
        rules: Sequence[Rule] = (),
        source: Source | None = None,
    ) -> tuple[nn.Module, tying.TieReport]:
        """Move the model, lay every parameter out by the rules, and where parameters or
        sequences are split, pin each block's output to the batch layout. A model built on
        the meta device is laid out first and each device's shards are read from `source`
        (this host reads its devices' shards only)."""
        if source is not None and on_meta(model):
            fill = functools.partial(self._fill_laid_out, model, rules, source)
            report = tying.move_and_retie(model, runtime.device(), fill)
            if activation_checkpointing:
                self.recompute_blocks(model, block_class)
        else:
            report = self.move(model, block_class, activation_checkpointing)
            self.place_parameters(model, rules)
        split = any(any(entry is not None for entry in spec) for spec in self.specs.values())
        if split or self.mesh_axes().get(SEQUENCE_AXIS, 1) > 1:
            for module in [*blocks_of(model, block_class), model]:
                self._constrain(module)
        return model, report

    def place_parameters(self, model: nn.Module, rules: Sequence[Rule] = ()) -> None:
        """Mark every parameter with its layout (rules, else the strategy's default)."""
        import torch_xla.distributed.spmd as xs

        params = {id(param): param for param in model.parameters()}
        self.specs = model_layout(model, rules, self.mesh_axes())
        for key, spec in self.specs.items():
            xs.mark_sharding(params[key], self.mesh(), spec)

    def _fill_laid_out(self, model: nn.Module, rules: Sequence[Rule], source: Source) -> None:
        """Each parameter created sharded by its layout from the shards this host's devices
        hold, one tensor at a time; the buffers whole."""
        specs = model_layout(model, rules, self.mesh_axes())  # by the meta parameters' ids

        def place(name: str, param: nn.Parameter) -> torch.Tensor:
            return self._sharded(name, param, specs[id(param)], source)

        fill_parameters(model, place)
        self.specs = model_layout(model, rules, self.mesh_axes())  # by the new ones' ids
        buffers_to(model, runtime.device())

    def _sharded(self, name: str, param: nn.Parameter, spec: Spec, source: Source) -> torch.Tensor:
        """A device tensor laid out by `spec`, built from the shards of this host's devices
        (each distinct shard read once; XLA's padding of uneven shards added here)."""
        import torch_xla

        if all(entry is None for entry in spec):  # whole on every device
            return source.read(name, whole(param.shape), param.dtype).to(runtime.device())
        sharding = self.mesh().get_op_sharding(spec)
        block = shard_shape(param.shape, spec, self.mesh_axes())
        local = len(torch_xla._XLAC._xla_get_runtime_devices())
        shape = list(param.shape)
        # Where each local device's shard lies: asked of a tensor of bools laid out alike.
        probe = torch_xla._XLAC._global_tensor_from_cpu_shards(
            [torch.zeros(block, dtype=torch.bool)] * local, sharding, shape
        )
        indices = [index for _, index in
                   torch_xla._XLAC._get_local_shard_replica_and_indices([probe])[0]]  # fmt: skip
        del probe
        keys = [tuple((part.start, part.stop) for part in index) for index in indices]
        region = _tiled_region(set(keys))
        held = None if region is None else source.read(
            name, tuple(slice(a, b) for a, b in region), param.dtype
        )  # fmt: skip
        read: dict[tuple[tuple[int, int], ...], torch.Tensor] = {}
        shards = []
        for key in keys:
            if key not in read:
                if held is None:
                    values = source.read(name, tuple(slice(a, b) for a, b in key), param.dtype)
                else:  # a view of the host's region: its shard's rows and columns
                    assert region is not None
                    values = held[tuple(slice(a - r, b - r) for (a, b), (r, _) in
                                        zip(key, region, strict=True))]  # fmt: skip
                padded = torch.zeros(block, dtype=param.dtype)
                padded[tuple(slice(0, n) for n in values.shape)] = values
                read[key] = padded
            shards.append(read[key])
        del held
        return torch_xla._XLAC._global_tensor_from_cpu_shards(shards, sharding, shape)

    def _constrain(self, module: nn.Module) -> None:
        """Keep `module`'s output split over the batch axes (whole over `tensor`; its tokens
        over `context`), and put an optimization barrier before its gradients are reduced,
        as FSDPv2 does per block."""
        import torch_xla.distributed.spmd as xs

        def pin(_: nn.Module, inputs: Any, output: Any) -> None:
            tensor = _first_tensor(output)
            if tensor is not None and tensor.dim() > 0:
                xs.mark_sharding(tensor, self.mesh(), self.token_spec(tensor))

        module.register_forward_hook(pin)
        xs.apply_backward_optimization_barrier(module)

    def check_scan(self) -> None:
        import importlib.util

        # torch_xla's scan lays its backward out under SPMD with jax's shard_alike.
        if importlib.util.find_spec("jax") is None:
            raise RuntimeConfigError(
                f"scan_layers under {self.name} needs jax (pip install 'torch_xla[pallas]'); "
                "without it use --strategy single, or scan_layers = false"
            )

    def place_optimizer_state(self, optimizer: torch.optim.Optimizer) -> None:
        """Lay each state tensor out like its parameter (a moment shaped like it), else whole.

        Left unannotated, the partitioner picks the state's layout on the first step and the
        second step, seeing inputs laid out differently, compiles again.
        """
        import torch_xla.distributed.spmd as xs

        for param, state in optimizer.state.items():
            for value in state.values():
                if not (torch.is_tensor(value) and value.device.type == "xla" and value.dim()):
                    continue
                spec = self.specs.get(id(param))
                xs.mark_sharding(value, self.mesh(), state_spec(spec, param.shape, value.shape))

    # ---- collectives ------------------------------------------------------------------
    def processes(self) -> int:
        return runtime.process_count()


def _first_tensor(output: Any) -> torch.Tensor | None:
    """The main tensor of a module's output: itself, the first of a tuple, or `logits`."""
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


def _tiled_region(keys: set[tuple[tuple[int, int], ...]]) -> tuple[tuple[int, int], ...] | None:
    """The box this host's distinct shards fill exactly (one read serves them all, where
    reading each apart would fetch the rows they share once per shard: over gs:// the
    columns of one row are one request), or None when they leave holes in it."""
    if len(keys) < 2:
        return None
    box = tuple((min(key[d][0] for key in keys), max(key[d][1] for key in keys))
                for d in range(len(next(iter(keys)))))  # fmt: skip
    volume = sum(math.prod(b - a for a, b in key) for key in keys)
    return box if volume == math.prod(b - a for a, b in box) else None
