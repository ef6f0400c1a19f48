"""The XLA operations the trainer needs, behind plain functions."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

# Plain torch, the same on every backend (`core.portable_ops`), asked of the ops as the rest.
from .portable_ops import prime_optimizer_state as prime_optimizer_state
from .portable_ops import seed_host as seed_host
from .portable_ops import to_cpu as to_cpu


def traced_lazily(tensor: torch.Tensor) -> bool:
    """True for a tensor on the XLA device: traced into a graph, no value before it runs."""
    return tensor.device.type == "xla"


def sync() -> None:
    """Cut the lazy graph here and run it (one training or eval step)."""
    import torch_xla

    torch_xla.sync()


def add_step_closure(fn: Callable[..., None], args: tuple[Any, ...] = ()) -> None:
    """Run `fn(*args)` after the current step executes, with its tensors materialized."""
    import torch_xla.core.xla_model as xm

    xm.add_step_closure(fn, args=args)


def to_host(tensors: list[torch.Tensor]) -> list[float]:
    """The values of computed device scalars, all read in one device-to-host transfer."""
    import torch_xla.core.xla_model as xm

    values: Any = xm._maybe_convert_to_cpu(list(tensors))  # one transfer for the list
    return [float(value) for value in values]


def read_tensors(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Computed device tensors as CPU tensors, all read in one device-to-host transfer."""
    import torch_xla.core.xla_model as xm

    values: Any = xm._maybe_convert_to_cpu(list(tensors))  # one transfer for the list
    return list(values)


def upload(tensor: torch.Tensor) -> torch.Tensor:
    """A host tensor on this process's device, in a buffer of its own: torch_xla hands
    uploads of equal small values one shared buffer, which a compiled step reading several of
    them would take for one input."""
    import torch_xla

    from .runtime import device

    X = torch_xla._XLAC
    cached = X._get_xla_enable_device_data_cache()
    X._set_xla_enable_device_data_cache(False)
    try:
        return tensor.to(device())
    finally:
        X._set_xla_enable_device_data_cache(cached)


def to_device(values: list[float]) -> torch.Tensor:
    """Host numbers as one float32 tensor on this process's device (an upload, not a read)."""
    from .runtime import device

    return torch.tensor(values, dtype=torch.float32).to(device())


def rng_state() -> int:
    """The XLA device RNG seed (part of an exact-resume checkpoint)."""
    import torch_xla.core.xla_model as xm

    return int(xm.get_rng_state())


def set_rng_state(seed: int) -> None:
    import torch_xla.core.xla_model as xm

    xm.set_rng_state(seed)


def initialize_compile_cache(path: str | None, readonly: bool = False) -> None:
    """Enable the persistent compilation cache before the first compilation (TPU only)."""
    if not path or os.environ.get("PJRT_DEVICE") != "TPU":
        return
    import torch_xla
    import torch_xla.runtime as xr

    if not torch_xla._XLAC._xla_computation_cache_is_initialized():  # not yet compiled
        xr.initialize_cache(path, readonly=readonly)


def compile_cache_use(path: str | None) -> dict[str, object] | None:
    """The persistent cache's folder and this run's hits and misses (None without one)."""
    if path is None:
        return None
    import torch_xla.debug.metrics as met

    return {
        "path": path,
        "hits": int(met.counter_value("PersistentCacheHit") or 0),
        "misses": int(met.counter_value("PersistentCacheMiss") or 0),
    }


def wait() -> None:
    """Block until every queued device computation has finished (for timing)."""
    import torch_xla.core.xla_model as xm

    xm.wait_device_ops()


def backward(loss: torch.Tensor) -> None:
    """`loss.backward()`: traced into the step's graph like the rest."""
    loss.backward()


def clip_grad_norm_(parameters: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients so that their global norm is at most `max_norm`."""
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm)


# Optimizers whose update takes a device tensor as its learning rate without reading it.
def host_learning_rate(optimizer: torch.optim.Optimizer) -> str | None:
    """Why `optimizer` needs its learning rate as a host number (None: it does not)."""
    if getattr(optimizer, "takes_device_lr", False):
        return None
    if isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        if all(group.get("capturable") for group in optimizer.param_groups):
            return None
        return f"{type(optimizer).__name__} without capturable=True computes its step on the host"
    return f"{type(optimizer).__name__} takes its learning rate as a host number"


# The kernels `lower_host_ops` registers (a torch.library.Library drops them when collected).
_LOWERED: list[torch.library.Library] = []


def lower_host_ops() -> None:
    """Give XLA its own kernels for the ops models use that torch_xla 2.9 runs on the host
    (idempotent): `aten::polar` (Llama 4's and DeepSeek-V2's rotary embeddings), which would
    copy the step's angles to the CPU and back every step."""
    if _LOWERED:
        return
    library = torch.library.Library("aten", "IMPL")
    library.impl("polar", _polar, "XLA")
    _LOWERED.append(library)


def _polar(abs: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    parts = torch.stack([abs * torch.cos(angle), abs * torch.sin(angle)], dim=-1)
    # Below functionalization here: torch_xla has the view's copy, and no torch.complex.
    return torch.ops.aten.view_as_complex_copy(parts)
