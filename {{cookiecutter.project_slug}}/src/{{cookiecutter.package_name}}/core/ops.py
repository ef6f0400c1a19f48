"""The XLA operations the trainer needs, behind plain functions."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch


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


def seed_host(seed: int) -> None:
    """Seed Python, NumPy and torch's CPU generator (no XLA runtime needed)."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def to_cpu(tree: Any) -> Any:
    """Copy a nest of device tensors to CPU (for checkpoints loadable without torch_xla)."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu")
    if isinstance(tree, dict):
        return {key: to_cpu(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_cpu(value) for value in tree)
    return tree


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


# Optimizer state entries that count steps: put back to where a fresh optimizer starts.
_COUNTERS = {"step": 0.0, "mu_product": 1.0}


def prime_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the optimizer's state now: one step on zero gradients that changes nothing.

    Created lazily by the first real step, the state would be constants in that step's
    graph and inputs of every later one: two graphs to compile. This dry step (lr and
    weight decay 0, gradients 0) makes every buffer the optimizer itself creates, with
    the values its first real step would start from; step counters are reset after it.
    """
    if any(optimizer.state.values()):
        return  # restored from a checkpoint, or already primed
    saved = [(group, group["lr"], group.get("weight_decay")) for group in optimizer.param_groups]
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    for group, _, decay in saved:
        # A capturable Adam divides by its learning rate: it keeps its own, and zero
        # gradients with no weight decay still change nothing.
        if not group.get("capturable"):
            group["lr"] = 0.0
        if decay is not None:
            group["weight_decay"] = 0.0
    for param in params:
        param.grad = torch.zeros_like(param)
    optimizer.step()
    for param in params:
        param.grad = None
    for group, lr, decay in saved:
        group["lr"] = lr
        if decay is not None:
            group["weight_decay"] = decay
    for state in optimizer.state.values():
        for key, start in _COUNTERS.items():
            if key in state:
                value = state[key]
                state[key] = value.fill_(start) if torch.is_tensor(value) else type(value)(start)
