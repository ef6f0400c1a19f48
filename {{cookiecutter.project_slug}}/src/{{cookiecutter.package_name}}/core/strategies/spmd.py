"""spmd: one process per host drives every local device over a device mesh.

Parameters are laid out by the sharding rules (`core/sharding.py`): with only a `data`
axis every parameter is replicated and each batch is split (data parallel); a `tensor`
axis splits the matrices the rules name; a `context` axis splits every sequence, its
tokens' activations pinned that way block by block. `fsdp` (fsdp.py) is the same with an
`fsdp` axis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .. import runtime, tying
from ..runtime import RuntimeConfigError
from ..sharding import (
    BATCH_AXES,
    SEQUENCE_AXIS,
    MeshShape,
    Rule,
    Spec,
    layout,
    mesh_devices,
    mesh_text,
    over_slices,
    parse_mesh,
    state_spec,
)
from .base import CPU_EMULATED_DEVICES, Strategy, blocks_of, checkpoint_blocks


class SpmdDataParallel(Strategy):
    """Data parallel under SPMD: the model replicated (but for what rules split), the batch
    sharded over the batch axes."""

    name = "spmd"
    sharded_axis = "data"  # the axis that must exist when a mesh is given
    lays_out_parameters = True

    def __init__(
        self, accelerator: str, devices: int | None, core: int | None = None, mesh: str = ""
    ) -> None:
        super().__init__(accelerator, devices, core)
        self.mesh_request = parse_mesh(mesh)
        self._mesh: Any = None
        self.specs: dict[int, Spec] = {}  # id(parameter) -> its layout

    @classmethod
    def create(
        cls, accelerator: str, devices: int | None, core: int | None = None, mesh: str = ""
    ) -> Strategy:
        if core is not None:
            raise RuntimeConfigError("one core id runs one device: use --strategy single")
        strategy = cls(accelerator, devices, None, mesh)
        axes = dict(strategy.mesh_request)
        if cls.name == "spmd" and "fsdp" in axes:
            raise RuntimeConfigError(
                "a mesh with an 'fsdp' axis shards the model: use --strategy fsdp"
            )
        # A mesh of sequences alone (`context=8`) is data parallel over nothing: spmd's.
        alone = cls.name == "spmd" and set(axes) == {SEQUENCE_AXIS}
        if axes and cls.sharded_axis not in axes and not alone:
            raise RuntimeConfigError(
                f"strategy {cls.name!r} needs a {cls.sharded_axis!r} axis in its mesh, "
                f"got {mesh_text(strategy.mesh_request)!r}"
            )
        if accelerator == "cpu" and devices is not None:
            strategy.check_mesh_size(devices)  # one host: known before anything starts
        return strategy

    def identity(self) -> tuple[Any, ...]:
        return (*super().identity(), self.mesh_request)

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
        self.check_mesh_size(runtime.global_device_count())
        over_slices(self.mesh_shape(), runtime.mesh_slice_count())  # refused here, not at first use

    def check_mesh_size(self, devices: int) -> None:
        """Refuse a mesh whose size is not the job's device count."""
        size = mesh_devices(self.mesh_request)
        if self.mesh_request and size != devices:
            raise RuntimeConfigError(
                f"mesh {mesh_text(self.mesh_request)!r} has {size} devices but the job has "
                f"{devices}: make the axis sizes multiply to {devices}"
            )

    def mesh_shape(self) -> MeshShape:
        """The mesh in use: the request, or every device on the strategy's own axis."""
        return self.mesh_request or ((self.sharded_axis, runtime.global_device_count()),)

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

    def mesh_axes(self) -> dict[str, int]:
        return dict(self.mesh_shape())

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

    def describe(self) -> str:
        return f"{super().describe()}, mesh {mesh_text(self.mesh_shape())}"

    # ---- processes and data -------------------------------------------------------
    def is_master(self) -> bool:
        return runtime.process_index() == 0

    def data_layout(self) -> tuple[int, int]:
        # One loader per host; each host's part of the batch is split over its devices.
        return runtime.process_count(), runtime.process_index()

    def local_devices(self) -> int:
        # The devices of a `context` group share their samples (each holds a stretch of
        # every one): a process feeds one batch per group.
        context = self.mesh_axes().get(SEQUENCE_AXIS, 1)
        return max(1, runtime.addressable_device_count() // context)

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
    ) -> tuple[nn.Module, tying.TieReport]:
        """Move the model, lay every parameter out by the rules, and where parameters or
        sequences are split, pin each block's output to the batch layout."""
        report = tying.move_and_retie(model, runtime.device())
        if activation_checkpointing:
            checkpoint_blocks(model, block_class)
        self.place_parameters(model, rules)
        split = any(any(entry is not None for entry in spec) for spec in self.specs.values())
        if split or self.mesh_axes().get(SEQUENCE_AXIS, 1) > 1:
            for module in [*blocks_of(model, block_class), model]:
                self._constrain(module)
        return model, report

    def place_parameters(self, model: nn.Module, rules: Sequence[Rule] = ()) -> None:
        """Mark every parameter with its layout (rules, else the strategy's default)."""
        import torch_xla.distributed.spmd as xs

        names: dict[int, list[str]] = {}
        params: dict[int, nn.Parameter] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            names.setdefault(id(param), []).append(name)  # a tied parameter has several
            params[id(param)] = param
        by_name = {found[0]: found for found in names.values()}
        shapes = {found[0]: tuple(params[key].shape) for key, found in names.items()}
        specs = layout(by_name, shapes, rules, self.mesh_axes())
        self.specs = {key: specs[found[0]] for key, found in names.items()}
        for key, spec in self.specs.items():
            xs.mark_sharding(params[key], self.mesh(), spec)

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

    def agree_any(self, flag: bool) -> bool:
        if self.processes() == 1:
            return flag
        return bool(runtime.host_all_reduce_max(int(flag)))

    def barrier(self, tag: str) -> None:
        if self.processes() > 1:
            runtime.host_barrier()


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
