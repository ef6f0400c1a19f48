"""What every strategy answers. The base class is one device in one process."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from .. import runtime, tying
from ..runtime import RuntimeConfigError
from ..sharding import Rule

# XLA:CPU emulates this many devices when `--devices all` is asked for off-TPU.
CPU_EMULATED_DEVICES = 8


class Strategy:
    """How a run spreads over devices: launch, data, model placement and collectives.

    Every mode-dependent decision of a run is a method here; nothing outside this
    package asks which strategy is in use.
    """

    name: ClassVar[str] = "single"
    # Whether parameters are laid out over a mesh by sharding rules (spmd, fsdp).
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
                f"a mesh is for strategies spmd and fsdp, not {cls.name!r}: "
                "drop mesh or change strategy"
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
        """XLA:CPU devices the runtime must emulate for this strategy."""
        return 1

    def launch(
        self, fn: Callable[..., Any], args: tuple[Any, ...] = (), start_method: str = "spawn"
    ) -> Any:
        """Run `fn(*args)` the way this strategy runs: here, in this process."""
        runtime.configure(self.accelerator, cpu_devices=self.cpu_devices(), tpu_core=self.core)
        self.start()
        return fn(*args)

    def spawns(self) -> bool:
        """True when `launch` starts processes of its own (their results cannot return)."""
        return False

    def start(self) -> None:
        """Runtime-wide set-up in the process that trains (before any XLA tensor)."""

    def describe(self) -> str:
        """One line for the start-of-run report."""
        kind = "TPU" if self.accelerator == "tpu" else "XLA:CPU"
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

    def local_devices(self) -> int:
        """Devices one process feeds: the per-process batch is this x the per-device batch."""
        return 1

    def mesh_axes(self) -> dict[str, int]:
        """The device mesh's axes and sizes (none for one device or one per process)."""
        return {}

    def input_sharding(self, sample: Any) -> Any:
        """How a batch shaped like `sample` is laid out over the devices (None: one device)."""
        return None

    # ---- model and optimizer state -----------------------------------------------
    def setup_model(
        self,
        model: nn.Module,
        block_class: type[nn.Module] | None = None,
        activation_checkpointing: bool = False,
        rules: Sequence[Rule] = (),
    ) -> tuple[nn.Module, tying.TieReport]:
        """Move the model to the device, keep its ties, and place it; return what trains.

        `rules` lay parameters out over a mesh; one device has none to lay them out on.
        """
        report = tying.move_and_retie(model, runtime.device())
        if activation_checkpointing:
            checkpoint_blocks(model, block_class)
        return model, report

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
        """True if any process raised `flag` (a host read: call it on a cadence)."""
        return flag

    def barrier(self, tag: str) -> None:
        """Wait until every process reaches this point."""

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


class SingleDevice(Strategy):
    """One device in one process: one TPU core (or chip), or XLA:CPU."""

    name = "single"

    @classmethod
    def create(
        cls, accelerator: str, devices: int | None, core: int | None = None, mesh: str = ""
    ) -> Strategy:
        if devices != 1:
            raise RuntimeConfigError(
                f"strategy 'single' runs on one device but devices={devices or 'all'}: "
                "use --devices 1, or --strategy spmd/fsdp/ddp for more"
            )
        return super().create(accelerator, devices, core, mesh)


def blocks_of(model: nn.Module, block_class: type[nn.Module] | None) -> list[nn.Module]:
    """The model's repeated blocks (instances of `block_class`), outermost first."""
    if block_class is None:
        return []
    return [m for m in model.modules() if isinstance(m, block_class) and m is not model]


def checkpoint_blocks(model: nn.Module, block_class: type[nn.Module] | None) -> int:
    """Recompute each block's activations in the backward pass instead of storing them."""
    from torch_xla.distributed.fsdp import checkpoint_module

    blocks = blocks_of(model, block_class)
    if not blocks:
        raise RuntimeConfigError(
            "activation_checkpointing needs the task to name its repeated block "
            "(block_class), or a model built from a BlockStack"
        )
    for block in blocks:
        checkpoint_module(block)
    return len(blocks)
