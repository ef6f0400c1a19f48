"""Keep tied (shared) weights tied across the move to an XLA device."""

from __future__ import annotations

import warnings

import torch
from torch import nn


def find_shared_parameters(module: nn.Module) -> list[list[str]]:
    """Return groups of parameter names that share one tensor (each group has 2+ names)."""
    groups: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def _resolve(module: nn.Module, dotted: str) -> tuple[nn.Module, str]:
    *path, leaf = dotted.split(".")
    owner = module
    for part in path:
        owner = owner.get_submodule(part)
    return owner, leaf


def tie_parameters(module: nn.Module, groups: list[list[str]]) -> None:
    """Point every name of each group at the group's first parameter."""
    for names in groups:
        first_owner, first_leaf = _resolve(module, names[0])
        shared = first_owner._parameters[first_leaf]
        for name in names[1:]:
            owner, leaf = _resolve(module, name)
            owner._parameters[leaf] = shared


def parameter_count(module: nn.Module) -> int:
    """Number of distinct parameter tensors (what an optimizer would see)."""
    return len(list(module.parameters()))


def move_to_device(module: nn.Module, device: torch.device | str) -> nn.Module:
    """Move a module to `device` and restore its weight tying.

    Finds shared parameters before the move, re-ties them after, then calls the
    module's `on_post_move_to_device()` hook if it has one. Warns with both counts
    if the number of distinct parameters changed anyway. Create optimizers after this.
    """
    groups = find_shared_parameters(module)
    before = parameter_count(module)
    module.to(device)
    tie_parameters(module, groups)
    hook = getattr(module, "on_post_move_to_device", None)
    if callable(hook):
        hook()
    after = parameter_count(module)
    if after != before:
        warnings.warn(
            f"the model had {before} distinct parameters before moving to {device} and "
            f"{after} after: some tied weights are no longer shared; re-tie them in "
            "on_post_move_to_device()",
            stacklevel=2,
        )
    return module
