"""The device operations the trainer needs, behind plain functions (TorchTPU: eager PyTorch).

A TorchTPU process runs PyTorch eagerly, with the step compiled by `torch.compile`
(`core/replay.py`): there is no lazy graph to cut, so `sync` does nothing and a step
closure runs at once, after the step that queued it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import health

# Plain torch, the same on every backend (`core.portable_ops`), asked of the ops as the rest.
from .portable_ops import prime_optimizer_state as prime_optimizer_state
from .portable_ops import seed_host as seed_host
from .portable_ops import to_cpu as to_cpu


def traced_lazily(tensor: torch.Tensor) -> bool:
    """False: every tensor is eager here (a graph is what torch.compile captures)."""
    return False


def sync() -> None:
    """Nothing to cut: every operation is already queued on the device."""


def add_step_closure(fn: Callable[..., None], args: tuple[Any, ...] = ()) -> None:
    """Run `fn(*args)` now: the step that made its tensors has been issued."""
    fn(*args)


def to_host(tensors: list[torch.Tensor]) -> list[float]:
    """The values of the step's scalars (its loss and metrics) as the global batch's: each
    process's averaged over the processes that read other data (one all-reduce: every
    process reads at the same steps, the logging cadence), read in one transfer."""
    from .runtime import mean_over_data

    health.count_transfer()
    values = torch.stack([t.detach().float().reshape(()) for t in mean_over_data(tensors)])
    return [float(value) for value in values.cpu()]


def read_tensors(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Computed device tensors as CPU tensors: one deliberate read, counted."""
    health.count_transfer()
    return [tensor.detach().cpu() for tensor in tensors]


def upload(tensor: torch.Tensor) -> torch.Tensor:
    """A host tensor on this process's device."""
    from .runtime import device

    return tensor.to(device())


def to_device(values: list[float]) -> torch.Tensor:
    """Host numbers as one float32 tensor on this process's device (an upload, not a read)."""
    from .runtime import device

    return torch.tensor(values, dtype=torch.float32).to(device())


def _device_module() -> Any:
    """torch.tpu on a TPU (its generator), None on the CPU stand-in (torch's own is saved)."""
    from .runtime import device

    kind = device().type
    return torch.get_device_module(kind) if kind != "cpu" else None


def rng_state() -> int:
    """The device generator's seed (part of an exact-resume checkpoint); 0 on the CPU, whose
    generator the checkpoint keeps whole."""
    module = _device_module()
    return int(module.initial_seed()) if module is not None else 0


def set_rng_state(seed: int) -> None:
    module = _device_module()
    if module is not None:
        module.manual_seed(seed)


def initialize_compile_cache(path: str | None, readonly: bool = False) -> None:
    """TorchTPU keeps its compiled programs itself; this project sets no cache of its own."""


def compile_cache_use(path: str | None) -> dict[str, object] | None:
    """No persistent cache is managed here (see `initialize_compile_cache`)."""
    return None


def wait() -> None:
    """Block until every queued device computation has finished (for timing)."""
    module = _device_module()
    if module is not None and hasattr(module, "synchronize"):
        module.synchronize()


@torch._dynamo.disable  # type: ignore[misc]
def backward(loss: torch.Tensor) -> None:
    """`loss.backward()`, outside dynamo: the step compiles around it (dynamo breaks there
    anyway), and the Python that autograd runs for DTensor gradients (the compiled
    backward's wrappers) would otherwise be traced and compiled again for every layout."""
    loss.backward()


def clip_grad_norm_(parameters: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients so that their global norm is at most `max_norm`.

    torch's own clip stacks every gradient's norm, which DTensors on different meshes
    refuse (with a `tensor` axis, the tensor-parallel layers' gradients live on the 2-D
    mesh and the others on the `fsdp` one). Here each process sums the squares of the
    gradient shards it holds, each divided by how many processes hold the same shard, and
    one all-reduce over the job gives the global norm: no gather, nothing dynamo cannot
    compile, one scalar scale for every gradient.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if len({getattr(grad, "device_mesh", None) for grad in grads}) <= 1:
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as funcol

    world = dist.get_world_size()
    squares = torch.stack([_shard_square(grad, world) for grad in grads]).sum()
    world_group = dist.group.WORLD
    assert world_group is not None
    total = funcol.all_reduce(squares, "sum", world_group).sqrt()
    scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for grad in grads:
        grad.mul_(scale)
    return total


def _shard_square(grad: torch.Tensor, world: int) -> torch.Tensor:
    """This process's share of `grad`'s squared norm: its local shard's, divided by the
    processes holding the same shard (the other coordinates of the job, and the mesh
    dimensions the gradient is replicated over)."""
    mesh = grad.device_mesh  # type: ignore[attr-defined]
    copies = world // mesh.size()
    for dim, placement in enumerate(grad.placements):  # type: ignore[attr-defined]
        if placement.is_replicate():
            copies *= mesh.size(dim)
        elif placement.is_partial():
            raise ValueError("a gradient still partial (not reduced) cannot be clipped")
    local = grad.to_local()  # type: ignore[attr-defined]
    return local.float().pow(2).sum() / copies


def host_learning_rate(optimizer: torch.optim.Optimizer) -> str | None:
    """Why `optimizer` needs its learning rate as a host number (None: it does not).

    The compiled step takes the learning rates as tensors; torch's optimizers compute with
    a tensor learning rate under torch.compile, so none needs a host number.
    """
    return None


def lower_host_ops() -> None:
    """Nothing to lower: the step is compiled by `torch.compile`, whose backend takes every
    op (on the CPU stand-in PyTorch's own kernels run them)."""
