"""The XLA operations the trainer needs, behind plain functions."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from . import runtime


def sync() -> None:
    """Cut the lazy graph here and run it (one training or eval step)."""
    import torch_xla

    torch_xla.sync()


def add_step_closure(fn: Callable[..., None], args: tuple[Any, ...] = ()) -> None:
    """Run `fn(*args)` after the current step executes, with its tensors materialized."""
    import torch_xla.core.xla_model as xm

    xm.add_step_closure(fn, args=args)


def reduce_gradients(optimizer: torch.optim.Optimizer, strategy: str) -> None:
    """All-reduce (average) gradients across ddp replicas; spmd and single need nothing."""
    if strategy == "ddp" and runtime.world_size() > 1:
        import torch_xla.core.xla_model as xm

        xm.reduce_gradients(optimizer)


def all_reduce_sum(tensor: torch.Tensor, strategy: str) -> torch.Tensor:
    """Sum a device tensor over ddp replicas (spmd tensors are already global)."""
    if strategy == "ddp" and runtime.world_size() > 1:
        import torch_xla.core.xla_model as xm

        reduced = xm.all_reduce(xm.REDUCE_SUM, tensor)
        assert isinstance(reduced, torch.Tensor)
        return reduced
    return tensor


def agree_any(flag: bool, strategy: str) -> bool:
    """True if any process raised `flag` (host-side; call on a cadence, not every step)."""
    if strategy == "ddp" and runtime.world_size() > 1:
        import torch_xla.core.xla_model as xm

        return bool(xm.mesh_reduce("agree_any", int(flag), max))
    return flag


def rendezvous(tag: str, strategy: str) -> None:
    """Wait for every ddp replica (e.g. until the writer finished a checkpoint)."""
    if strategy == "ddp" and runtime.world_size() > 1:
        import torch_xla.core.xla_model as xm

        xm.rendezvous(tag)


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


def initialize_compile_cache(path: str | None) -> None:
    """Enable the persistent compilation cache (TPU; XLA:CPU cannot reuse it)."""
    if not path or os.environ.get("PJRT_DEVICE") != "TPU":
        return
    import torch_xla.runtime as xr

    xr.initialize_cache(path, readonly=not runtime.is_local_master())


def wait() -> None:
    """Block until every queued device computation has finished (for timing)."""
    import torch_xla.core.xla_model as xm

    xm.wait_device_ops()


def prime_adam_state(optimizer: torch.optim.Optimizer) -> None:
    """Create Adam/AdamW moments now, as device data, exactly as the first step would.

    Created lazily, they are constants in the first step's graph and inputs of every
    later one: two graphs to compile. Made here, step 1 already runs the steady graph.
    """
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state[param]
            if state or not param.requires_grad:
                continue
            # Host zeros moved to the device are device data; zeros made on it would be IR.
            zeros = torch.zeros(param.shape, dtype=param.dtype)
            state["step"] = torch.tensor(0.0, dtype=torch.float32)  # on the host, as torch
            state["exp_avg"] = zeros.to(param.device)
            state["exp_avg_sq"] = zeros.to(param.device)
            if group.get("amsgrad"):
                state["max_exp_avg_sq"] = zeros.to(param.device)


def replicate_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Pin parameters and optimizer state as replicated over the SPMD mesh.

    Left unannotated, the partitioner picks the outputs' sharding on the first step,
    the second step sees inputs sharded differently and compiles a second graph.
    """
    import torch_xla.distributed.spmd as xs

    from .data import data_mesh

    mesh = data_mesh()
    tensors: list[torch.Tensor] = list(module.parameters())
    for state in optimizer.state.values():
        tensors += [v for v in state.values() if torch.is_tensor(v) and v.device.type == "xla"]
    for tensor in tensors:
        xs.mark_sharding(tensor, mesh, (None,) * tensor.dim())
