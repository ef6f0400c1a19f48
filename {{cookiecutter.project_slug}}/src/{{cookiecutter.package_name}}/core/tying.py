"""Keep tied (shared) weights tied across the move to an XLA device."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

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


@dataclass(frozen=True)
class TieReport:
    """Tied parameter groups found before a move, and distinct parameters before/after."""

    groups: list[list[str]]
    before: int
    after: int

    @property
    def intact(self) -> bool:
        return self.before == self.after

    def describe(self) -> str:
        """One line for the start-of-run report."""
        if not self.groups:
            return f"tied parameters: none ({self.after} distinct parameters)"
        names = "; ".join(" = ".join(group) for group in self.groups)
        state = "re-tied" if self.intact else "NOT all re-tied"
        return f"tied parameters: {len(self.groups)} group(s) {state} ({names}); " + (
            f"{self.after} distinct parameters"
        )

    def to_dict(self) -> dict[str, object]:
        return {"groups": self.groups, "before": self.before, "after": self.after}


def move_and_retie(
    module: nn.Module, device: torch.device | str, fill: Callable[[], None] | None = None
) -> TieReport:
    """Move a module to `device`, restore its weight tying and report what was tied.

    Finds shared parameters before the move, re-ties them after, then calls the
    module's `on_post_move_to_device()` hook if it has one. Warns with both counts
    if the number of distinct parameters changed anyway. Create optimizers after this.
    A module built on the meta device is not moved: `fill()` gives it its values, each
    tied group once under all its names (`core/materialize.py`).
    """
    groups = find_shared_parameters(module)
    before = parameter_count(module)
    if fill is not None:
        fill()
    else:
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
            stacklevel=3,
        )
    return TieReport(groups, before, after)


def move_to_device(module: nn.Module, device: torch.device | str) -> nn.Module:
    """Move a module to `device` and restore its weight tying (see `move_and_retie`)."""
    move_and_retie(module, device)
    return module
