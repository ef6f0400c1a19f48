"""spmd: one process per host drives every local device over a device mesh.

The model is replicated and each batch is split over the `data` axis. The mesh, its
validation and the input layout are shared with `fsdp` (see fsdp.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .. import runtime, tying
from ..runtime import RuntimeConfigError
from .base import CPU_EMULATED_DEVICES, Strategy

# Mesh axes this project shards over, in mesh order.
AXES = ("data", "fsdp")

MeshShape = tuple[tuple[str, int], ...]


def parse_mesh(text: str) -> MeshShape:
    """Parse `fsdp=8` or `data=2,fsdp=4` into ordered (axis, size) pairs."""
    pairs: list[tuple[str, int]] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        axis, sep, size = item.partition("=")
        axis = axis.strip()
        if not sep or not size.strip().isdigit() or int(size) < 1:
            raise RuntimeConfigError(
                f"mesh entry {item!r} must look like axis=size with a positive size "
                "(e.g. mesh='data=2,fsdp=4')"
            )
        if axis not in AXES:
            raise RuntimeConfigError(f"unknown mesh axis {axis!r}: the axes are {', '.join(AXES)}")
        if axis in dict(pairs):
            raise RuntimeConfigError(f"mesh axis {axis!r} is given twice")
        pairs.append((axis, int(size)))
    return tuple(sorted(pairs, key=lambda pair: AXES.index(pair[0])))


def mesh_text(shape: MeshShape) -> str:
    return ",".join(f"{axis}={size}" for axis, size in shape)


class SpmdDataParallel(Strategy):
    """Data parallel under SPMD: the model replicated, the batch sharded over `data`."""

    name = "spmd"
    sharded_axis = "data"  # the axis that must exist when a mesh is given

    def __init__(
        self, accelerator: str, devices: int | None, core: int | None = None, mesh: str = ""
    ) -> None:
        super().__init__(accelerator, devices, core)
        self.mesh_request = parse_mesh(mesh)
        self._mesh: Any = None

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
        if axes and cls.sharded_axis not in axes:
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

    def check_mesh_size(self, devices: int) -> None:
        """Refuse a mesh whose size is not the job's device count."""
        size = 1
        for _, axis_size in self.mesh_request:
            size *= axis_size
        if self.mesh_request and size != devices:
            raise RuntimeConfigError(
                f"mesh {mesh_text(self.mesh_request)!r} has {size} devices but the job has "
                f"{devices}: make the axis sizes multiply to {devices}"
            )

    def mesh_shape(self) -> MeshShape:
        """The mesh in use: the request, or every device on the strategy's own axis."""
        return self.mesh_request or ((self.sharded_axis, runtime.global_device_count()),)

    def mesh(self) -> Any:
        if self._mesh is None:
            import numpy as np
            import torch_xla.distributed.spmd as xs

            shape = self.mesh_shape()
            sizes = tuple(size for _, size in shape)
            self._mesh = xs.Mesh(
                np.arange(int(np.prod(sizes))), sizes, tuple(axis for axis, _ in shape)
            )
        return self._mesh

    def batch_axes(self) -> Any:
        """The mesh axes a batch's first dimension is split over."""
        axes = tuple(axis for axis, _ in self.mesh_shape())
        return axes[0] if len(axes) == 1 else axes

    def describe(self) -> str:
        return f"{super().describe()}, mesh {mesh_text(self.mesh_shape())}"

    # ---- processes and data -------------------------------------------------------
    def is_master(self) -> bool:
        return runtime.process_index() == 0

    def data_layout(self) -> tuple[int, int]:
        # One loader per host; each host's part of the batch is split over its devices.
        return runtime.process_count(), runtime.process_index()

    def local_devices(self) -> int:
        return runtime.addressable_device_count()

    def input_sharding(self, sample: Any) -> Any:
        import torch_xla.distributed.spmd as xs

        multi_host = runtime.process_count() > 1

        def spec(tensor: torch.Tensor) -> Any:
            dims = (self.batch_axes(),) + (None,) * (tensor.dim() - 1)
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
    ) -> tuple[nn.Module, tying.TieReport]:
        model, report = super().setup_model(model, block_class, activation_checkpointing)
        for param in model.parameters():
            self.replicate(param)
        return model, report

    def check_scan(self) -> None:
        import importlib.util

        # torch_xla's scan lays its backward out under SPMD with jax's shard_alike.
        if importlib.util.find_spec("jax") is None:
            raise RuntimeConfigError(
                f"scan_layers under {self.name} needs jax (pip install 'torch_xla[pallas]'); "
                "without it use --strategy single, or scan_layers = false"
            )

    def replicate(self, tensor: torch.Tensor) -> None:
        import torch_xla.distributed.spmd as xs

        xs.mark_sharding(tensor, self.mesh(), (None,) * tensor.dim())

    def place_optimizer_state(self, optimizer: torch.optim.Optimizer) -> None:
        # Left unannotated, the partitioner picks the state's layout on the first step
        # and the second step, seeing inputs laid out differently, compiles again.
        for tensor in state_tensors(optimizer):
            self.replicate(tensor)

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


def state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's per-parameter state tensors that live on the XLA device."""
    return [
        value
        for state in optimizer.state.values()
        for value in state.values()
        if torch.is_tensor(value) and value.device.type == "xla" and value.dim() > 0
    ]
