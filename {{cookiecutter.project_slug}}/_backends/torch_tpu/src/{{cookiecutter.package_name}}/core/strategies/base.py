"""What every strategy answers. The base class is one device in one process."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from .. import runtime, tying
from ..runtime import RuntimeConfigError
from ..sharding import Rule
from .blocks import CHECKPOINT_PREFIX, checkpoint_blocks
from .blocks import blocks_of as blocks_of  # asked of every backend's strategies.base
from .spawning import spawn

# `--devices all` off a TPU starts this many CPU processes.
CPU_EMULATED_DEVICES = 8


class Strategy:
    """How a run spreads over devices: launch, data, model placement and collectives.

    Every mode-dependent decision of a run is a method here; nothing outside this
    package asks which strategy is in use.
    """

    name: ClassVar[str] = "single"
    # Whether parameters are laid out over a mesh by sharding rules (fsdp).
    lays_out_parameters: ClassVar[bool] = False

    def __init__(self, accelerator: str, devices: int | None, core: int | None = None) -> None:
        self.accelerator = accelerator
        self.devices = devices
        self.core = core

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.accelerator!r}, devices={self.devices})"

    @classmethod
    def create(
        cls, accelerator: str, devices: int | None, core: int | None = None, mesh: str = ""
    ) -> Strategy:
        """Check a request for this strategy and build it; RuntimeConfigError says why not."""
        if mesh.strip():
            raise RuntimeConfigError(
                f"a mesh is for strategy fsdp, not {cls.name!r}: drop mesh or change strategy"
            )
        return cls(accelerator, devices, core)

    def identity(self) -> tuple[Any, ...]:
        """What makes two strategies the same plan."""
        return (type(self), self.accelerator, self.devices, self.core)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Strategy) and self.identity() == other.identity()

    def __hash__(self) -> int:
        return hash(self.identity())

    # ---- launch -------------------------------------------------------------------
    def cpu_devices(self) -> int:
        """Processes this strategy runs on one host."""
        return 1

    def launch(
        self, fn: Callable[..., Any], args: tuple[Any, ...] = (), start_method: str = "spawn"
    ) -> Any:
        """Run `fn(*args)` here, or in one process per device that torchrun's launcher starts
        (when this process is not one torchrun started already); return process 0's result."""
        runtime.configure(self.accelerator, tpu_core=self.core)
        if self.spawns():
            return spawn(self, fn, args, start_method)
        self.start()
        return fn(*args)

    def spawns(self) -> bool:
        """True when `launch` starts processes of its own (process 0's result returns)."""
        return False

    def start(self) -> None:
        """Set-up in the process that trains, before any device tensor: its process group."""
        runtime.init_process_group()
        if runtime.accelerator() == "cpu":
            # Processes share the host's cores: one thread each keeps them from fighting.
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(local, 1)))

    def describe(self) -> str:
        """One line for the start-of-run report."""
        kind = "TPU" if self.accelerator == "tpu" else "CPU"
        return (
            f"{self.name} on {runtime.global_device_count()} {kind} device(s), "
            f"{runtime.process_count()} process(es)"
        )

    # ---- processes and data -------------------------------------------------------
    def is_master(self) -> bool:
        """True in exactly one process of the job: the one that logs and writes files."""
        return runtime.global_ordinal() == 0

    def is_local_master(self) -> bool:
        """True in one process per host: the one that writes host-local files (caches)."""
        return runtime.local_ordinal() == 0

    def data_layout(self) -> tuple[int, int]:
        """(replicas, rank) the training data is sharded over."""
        return 1, 0

    def local_devices(self) -> int:
        """Devices one process feeds: one."""
        return 1

    def mesh_axes(self) -> dict[str, int]:
        """The device mesh's axes and sizes (none for one device or one per process)."""
        return {}

    def input_sharding(self, sample: Any) -> Any:
        """How a batch is laid out over the devices: each process holds its own, whole."""
        return None

    # ---- model and optimizer state -----------------------------------------------
    def setup_model(
        self,
        model: nn.Module,
        block_class: type[nn.Module] | None = None,
        activation_checkpointing: bool = False,
        rules: Sequence[Rule] = (),
    ) -> tuple[nn.Module, tying.TieReport]:
        """Move the model to the device, keep its ties, and place it; return what trains."""
        report = tying.move_and_retie(model, runtime.device())
        if activation_checkpointing:
            checkpoint_blocks(model, block_class)
        return model, report

    def check_scan(self) -> None:
        """Refuse scan_layers: it runs through torch_xla's scan, which this backend lacks."""
        raise RuntimeConfigError(
            "scan_layers runs blocks through torch_xla's scan, which the torch_tpu backend "
            "does not have: set scan_layers = false"
        )

    def place_optimizer_state(self, optimizer: torch.optim.Optimizer) -> None:
        """Nothing to place: optimizer state is created like its parameter (a DTensor too)."""

    def plain_name(self, name: str) -> str:
        """A parameter's name in the plain model (without what a wrapper inserted)."""
        return name.replace(CHECKPOINT_PREFIX, "")

    def model_state_dict(self, model: nn.Module) -> dict[str, Any]:
        """The model's tensors under the plain model's names (what checkpoints use)."""
        return {self.plain_name(k): v for k, v in model.state_dict().items()}

    def load_model_state_dict(self, model: nn.Module, state: Mapping[str, Any]) -> None:
        """Load a state saved by `model_state_dict` (or part of it), whatever strategy saved it."""
        names = {self.plain_name(k): k for k in model.state_dict()}
        model.load_state_dict({names[k]: v for k, v in state.items()}, strict=False)

    # ---- collectives ------------------------------------------------------------------
    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Combine gradients across replicas before the optimizer step (DDP and FSDP2 do it
        in the backward pass)."""

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum a device tensor over the replicas that each hold a part of the data."""
        return tensor

    def agree_any(self, flag: bool) -> bool:
        """True if any process raised `flag` (a host read: call it on a cadence)."""
        if self.processes() == 1:
            return flag
        return bool(runtime.host_all_reduce_max(int(flag)))

    def barrier(self, tag: str) -> None:
        """Wait until every process reaches this point."""
        if self.processes() > 1:
            runtime.host_barrier()

    def agree_to_stop(self, requested: bool, on_cadence: bool) -> bool:
        """Whether the whole job stops now because some process was asked to (processes
        exchange their flags on a shared cadence only, so none waits alone)."""
        if self.processes() == 1:
            return requested
        return on_cadence and self.agree_any(requested)

    def processes(self) -> int:
        """Processes taking part in the job."""
        return runtime.world_size()


class SingleDevice(Strategy):
    """One device in one process: one TPU chip, or the CPU."""

    name = "single"

    @classmethod
    def create(
        cls, accelerator: str, devices: int | None, core: int | None = None, mesh: str = ""
    ) -> Strategy:
        if devices != 1:
            raise RuntimeConfigError(
                f"strategy 'single' runs on one device but devices={devices or 'all'}: "
                "use --devices 1, or --strategy ddp/fsdp for more"
            )
        return super().create(accelerator, devices, core, mesh)


class ProcessPerDevice(Strategy):
    """A strategy with one process per device, started by torchrun (or by `launch`)."""

    @classmethod
    def create(
        cls, accelerator: str, devices: int | None, core: int | None = None, mesh: str = ""
    ) -> Strategy:
        if core is not None:
            raise RuntimeConfigError("one core id runs one device: use --strategy single")
        return super().create(accelerator, devices, core, mesh)

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
