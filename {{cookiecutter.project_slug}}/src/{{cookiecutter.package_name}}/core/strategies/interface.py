"""What every strategy answers, on either backend: the base class is one device in one
process; each backend's `strategies.base` adds how it launches and recomputes blocks."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Self

import torch
from torch import nn

from .. import runtime, tying
from ..materialize import Source, fill_whole, on_meta
from ..runtime import RuntimeConfigError
from ..sharding import MeshShape, Rule, mesh_text, parse_mesh


class Strategy:
    """How a run spreads over devices: launch, data, model placement and collectives.

    Every mode-dependent decision of a run is a method here; nothing outside this
    package asks which strategy is in use.
    """

    name: ClassVar[str] = "single"
    # Whether parameters are laid out over a mesh by sharding rules.
    lays_out_parameters: ClassVar[bool] = False
    # The backend's strategies that take a mesh, and those that run on several devices
    # (named by the errors that refuse a request).
    mesh_strategies: ClassVar[tuple[str, ...]] = ()
    many_device_strategies: ClassVar[tuple[str, ...]] = ()
    # What the start-of-run report calls a device off a TPU.
    cpu_kind: ClassVar[str] = "CPU"

    def __init__(self, accelerator: str, devices: int | None, core: int | None = None) -> None:
        self.accelerator = accelerator
        self.devices = devices
        self.core = core

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.accelerator!r}, devices={self.devices})"

    @classmethod
    def create(
        cls, accelerator: str, devices: int | None, core: int | None = None, mesh: str = ""
    ) -> Self:
        """Check a request for this strategy and build it; RuntimeConfigError says why not."""
        cls.check_request(accelerator, devices, core, mesh)
        return cls(accelerator, devices, core)

    @classmethod
    def check_request(
        cls, accelerator: str, devices: int | None, core: int | None, mesh: str
    ) -> None:
        """Refuse what this strategy cannot run (RuntimeConfigError): one device's core id,
        a mesh."""
        if core is not None:
            raise RuntimeConfigError("one core id runs one device: use --strategy single")
        if mesh.strip():
            which = "strategies " if len(cls.mesh_strategies) > 1 else "strategy "
            raise RuntimeConfigError(
                f"a mesh is for {which}{' and '.join(cls.mesh_strategies)}, not {cls.name!r}: "
                "drop mesh or change strategy"
            )

    def identity(self) -> tuple[Any, ...]:
        """What makes two strategies the same plan."""
        return (type(self), self.accelerator, self.devices, self.core)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Strategy) and self.identity() == other.identity()

    def __hash__(self) -> int:
        return hash(self.identity())

    # ---- launch -------------------------------------------------------------------
    def cpu_devices(self) -> int:
        """Devices (processes, on a backend with one per device) off a TPU."""
        return 1

    def launch(
        self, fn: Callable[..., Any], args: tuple[Any, ...] = (), start_method: str = "spawn"
    ) -> Any:
        """Run `fn(*args)` the way this strategy runs: here, in this process."""
        runtime.configure(self.accelerator, cpu_devices=self.cpu_devices(), tpu_core=self.core)
        self.start()
        return fn(*args)

    def spawns(self) -> bool:
        """True when `launch` starts processes of its own."""
        return False

    def returns_result(self) -> bool:
        """True when `launch` returns what `fn` returned (a spawning launch may not)."""
        return not self.spawns()

    def start(self) -> None:
        """Set-up in the process that trains, before any device tensor."""

    def describe(self) -> str:
        """One line for the start-of-run report."""
        kind = "TPU" if self.accelerator == "tpu" else self.cpu_kind
        return (
            f"{self.name} on {runtime.global_device_count()} {kind} device(s), "
            f"{runtime.process_count()} process(es)"
        )

    # ---- processes and data -------------------------------------------------------
    def is_master(self) -> bool:
        """True in exactly one process of the job: the one that logs and writes files."""
        return True

    def is_local_master(self) -> bool:
        """True in one process per host: the one that writes host-local files (caches)."""
        return True

    def data_layout(self) -> tuple[int, int]:
        """(replicas, rank) the training data is sharded over."""
        return 1, 0

    def local_batch_shards(self) -> int:
        """Batch shards one process feeds: its batch is this x `batch_size`.

        `batch_size` is the samples of one device of the data axes (data, fsdp, expert):
        the devices of a `tensor` or `context` group share theirs, so the global batch is
        `batch_size` x the product of the data axes, on either backend and any mesh.
        """
        return 1

    def mesh_axes(self) -> dict[str, int]:
        """The device mesh's axes and sizes (none for one device or one per process)."""
        return {}

    def input_sharding(self, sample: Any) -> Any:
        """How a batch shaped like `sample` is laid out over the devices (None: each
        process holds its own, whole)."""
        return None

    def place_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host tensor whose first dimension is this process's rows of a batch (a batch of
        prompts, a key/value cache's slots), on the device and laid out as a batch is."""
        from .. import ops

        return ops.upload(tensor)

    def keep_rows(self, tensor: torch.Tensor) -> None:
        """Have a tensor a compiled step computes laid out as `place_rows` lays it out (the
        step's next run then reads its state as it read it the first time)."""

    def settle(self, tensors: Sequence[torch.Tensor]) -> None:
        """Give each of `tensors` that has no layout the one a compiled step's output of it
        gets, so the step's first run reads its state as every later run does."""

    def keep_whole(self, tensor: torch.Tensor) -> None:
        """Have a tensor a compiled step computes laid out whole on every device (the host
        reads it); one process's tensors are whole already."""

    def local_heads(self, heads: int) -> int:
        """How many of a layer's `heads` (key/value heads) the attention of one process
        computes on: all of them, but for a tensor-parallel process's share."""
        return heads

    # ---- model and optimizer state -----------------------------------------------
    def setup_model(
        self,
        model: nn.Module,
        block_class: type[nn.Module] | None = None,
        activation_checkpointing: bool = False,
        rules: Sequence[Rule] = (),
        source: Source | None = None,
    ) -> tuple[nn.Module, tying.TieReport]:
        """Move the model to the device, keep its ties, and place it; return what trains.

        `rules` lay parameters out over a mesh; one device has none to lay them out on. A
        model built on the meta device gets its values from `source` where it is placed.
        """
        return model, self.move(model, block_class, activation_checkpointing, source)

    def move(
        self,
        model: nn.Module,
        block_class: type[nn.Module] | None,
        activation_checkpointing: bool,
        source: Source | None = None,
    ) -> tying.TieReport:
        """Move the model to the device keeping its ties (a model on the meta device: fill
        it there from `source`, whole) and, when asked, have its blocks recompute their
        activations in the backward pass; the ties' report."""
        device = runtime.device()
        fill = None
        if source is not None and on_meta(model):
            fill = functools.partial(fill_whole, model, source, device)
        report = tying.move_and_retie(model, device, fill)
        if activation_checkpointing:
            self.recompute_blocks(model, block_class)
        return report

    def recompute_blocks(self, model: nn.Module, block_class: type[nn.Module] | None) -> int:
        """Recompute each block's activations in the backward pass instead of storing them
        (the backend's way); how many blocks."""
        raise NotImplementedError

    def check_scan(self) -> None:
        """Refuse scan_layers where this strategy cannot run it (RuntimeConfigError)."""

    def place_optimizer_state(self, optimizer: torch.optim.Optimizer) -> None:
        """Lay the optimizer's state out like the parameters it belongs to."""

    def plain_name(self, name: str) -> str:
        """A parameter's name in the plain model (without what a wrapper inserted)."""
        return name

    def model_state_dict(self, model: nn.Module) -> dict[str, Any]:
        """The model's tensors under the plain model's names (what checkpoints use)."""
        return {self.plain_name(k): v for k, v in model.state_dict().items()}

    def load_model_state_dict(self, model: nn.Module, state: Mapping[str, Any]) -> None:
        """Load a state saved by `model_state_dict` (or part of it), whatever strategy saved it."""
        names = {self.plain_name(k): k for k in model.state_dict()}
        model.load_state_dict({names[k]: v for k, v in state.items()}, strict=False)

    # ---- collectives ------------------------------------------------------------------
    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Combine gradients across replicas before the optimizer step."""

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum a device tensor over the replicas that each hold a part of the data."""
        return tensor

    def agree_any(self, flag: bool) -> bool:
        """True if any process raised `flag` (a host exchange: call it on a cadence)."""
        if self.processes() == 1:
            return flag
        return bool(runtime.host_all_reduce_max(int(flag)))

    def barrier(self, tag: str) -> None:
        """Wait until every process reaches this point."""
        if self.processes() > 1:
            runtime.host_barrier()

    def agree_to_stop(self, requested: bool, on_cadence: bool) -> bool:
        """Whether the whole job stops now because some process was asked to.

        One process decides alone at any step. Several exchange their flags only on a
        shared cadence (every process asks at the same steps), so none is left waiting
        in a collective the others have stopped joining.
        """
        if self.processes() == 1:
            return requested
        return on_cadence and self.agree_any(requested)

    def processes(self) -> int:
        """Processes taking part in the job."""
        return 1


class OneDevice(Strategy):
    """One device in one process (each backend's `SingleDevice` adds its launch)."""

    name = "single"

    @classmethod
    def check_request(
        cls, accelerator: str, devices: int | None, core: int | None, mesh: str
    ) -> None:
        if devices != 1:
            raise RuntimeConfigError(
                f"strategy 'single' runs on one device but devices={devices or 'all'}: "
                f"use --devices 1, or --strategy {'/'.join(cls.many_device_strategies)} for more"
            )
        super().check_request(accelerator, devices, None, mesh)


class OnMesh(Strategy):
    """A strategy over a device mesh of named axes (`mesh = "fsdp=4,tensor=2"`), which the
    sharding rules lay parameters out over."""

    lays_out_parameters = True
    # The axis a requested mesh must have; without a request, every device is on it.
    sharded_axis: ClassVar[str] = "fsdp"

    def __init__(
        self, accelerator: str, devices: int | None, core: int | None = None, mesh: str = ""
    ) -> None:
        super().__init__(accelerator, devices, core)
        self.mesh_request = parse_mesh(mesh)
        self._mesh: Any = None

    @classmethod
    def create(
        cls, accelerator: str, devices: int | None, core: int | None = None, mesh: str = ""
    ) -> Self:
        cls.check_request(accelerator, devices, core, "")
        strategy = cls(accelerator, devices, None, mesh)
        strategy.check_mesh()
        return strategy

    def check_mesh(self) -> None:
        """Refuse a requested mesh this strategy cannot run (RuntimeConfigError)."""
        if self.mesh_request and self.sharded_axis not in dict(self.mesh_request):
            raise RuntimeConfigError(
                f"strategy {self.name!r} needs a {self.sharded_axis!r} axis in its mesh, "
                f"got {mesh_text(self.mesh_request)!r}"
            )

    def identity(self) -> tuple[Any, ...]:
        return (*super().identity(), self.mesh_request)

    def mesh_shape(self) -> MeshShape:
        """The mesh in use: the request, or every device on the strategy's own axis."""
        return self.mesh_request or ((self.sharded_axis, runtime.global_device_count()),)

    def mesh_axes(self) -> dict[str, int]:
        return dict(self.mesh_shape())

    def describe(self) -> str:
        return f"{super().describe()}, mesh {mesh_text(self.mesh_shape())}"


def blocks_of(model: nn.Module, block_class: type[nn.Module] | None) -> list[nn.Module]:
    """The model's repeated blocks (instances of `block_class`), outermost first."""
    if block_class is None:
        return []
    return [m for m in model.modules() if isinstance(m, block_class) and m is not model]


def blocks_to_recompute(model: nn.Module, block_class: type[nn.Module] | None) -> list[nn.Module]:
    """The blocks activation checkpointing wraps; RuntimeConfigError when there are none."""
    blocks = blocks_of(model, block_class)
    if not blocks:
        raise RuntimeConfigError(
            "activation_checkpointing needs the task to name its repeated block "
            "(block_class), or a model built from a BlockStack"
        )
    return blocks
