"""Operations in plain torch, the same on every backend: seeding the host's generators,
copying a nest of device tensors to the CPU, and creating an optimizer's state before its
first step."""

from __future__ import annotations

from typing import Any

import torch


def seed_host(seed: int) -> None:
    """Seed Python, NumPy and torch's CPU generator."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def to_cpu(tree: Any) -> Any:
    """Copy a nest of device tensors to CPU (checkpoints that load without the device runtime)."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu")
    if isinstance(tree, dict):
        return {key: to_cpu(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_cpu(value) for value in tree)
    return tree


# Optimizer state entries that count steps: put back to where a fresh optimizer starts.
_COUNTERS = {"step": 0.0, "mu_product": 1.0}


def prime_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the optimizer's state now: one step on zero gradients that changes nothing.

    Created lazily by the first real step, the state would change the compiled step's
    inputs between its first and second call: a second graph to compile. This dry step (lr
    and weight decay 0, gradients 0) makes every buffer the optimizer itself creates, with
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
