"""Bytes of parameters and optimizer state, in total and on the fullest device.

Read from each tensor's layout, so nothing is transferred: a DTensor (FSDP2, tensor
parallel) costs each device its local shard; a plain tensor is whole on its device.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from . import state_size
from .sharding import Spec, axes_of
from .state_size import describe as describe
from .state_size import human as human

# Whether the counts include optimizer state scalars: not here (`_sized`), step counts
# stay the optimizer's own scalars.
SCALAR_STATE_COUNTED = False


def held_spec(spec: Spec, mesh: Mapping[str, int], in_block: bool) -> Spec:
    """How each process holds a parameter the rules lay out as `spec`: their `tensor`
    entries as they say inside the repeated blocks (`in_block`; outside them a parameter is
    whole over `tensor`, see `strategies/fsdp.py`), and, on a mesh with `fsdp`, FSDP2's
    split of the first dimension over it (after the tensor split), whichever dimension the
    rules give `fsdp`; the first process holds the larger part of an uneven split
    (`torch.chunk`)."""
    dropped = {"fsdp"} | (set() if in_block else {"tensor"})
    kept = [tuple(axis for axis in axes_of(e) if axis not in dropped) for e in spec]
    if kept and mesh.get("fsdp", 1) > 1:
        kept[0] = (*kept[0], "fsdp")
    return tuple(None if not axes else axes[0] if len(axes) == 1 else axes for axes in kept)


def sharding_of(tensor: torch.Tensor) -> str:
    """A DTensor's placements over its mesh (empty for a plain tensor)."""
    placements = getattr(tensor, "placements", None)
    return str(tuple(placements)) if placements is not None else ""


def tensor_bytes(tensor: torch.Tensor) -> tuple[int, int]:
    """(bytes of the whole tensor, bytes one device holds)."""
    size = tensor.element_size()
    to_local = getattr(tensor, "to_local", None)
    local = to_local() if callable(to_local) else tensor
    return tensor.numel() * size, local.numel() * size


def state_memory(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, int]:
    """Parameter and optimizer-state bytes, in total and per device (this process's shard)."""
    return state_size.state_memory(model, optimizer, tensor_bytes, _sized)


def _sized(tensor: torch.Tensor) -> bool:
    """Optimizer state other than scalars (a step count)."""
    return bool(tensor.dim())


def device_peak_bytes(device: Any) -> int | None:
    """Peak bytes the device has held, where its runtime reports it (a TPU; not the CPU)."""
    kind = getattr(device, "type", str(device))
    if kind == "cpu":
        return None
    try:
        return int(torch.get_device_module(kind).max_memory_allocated())
    except Exception:  # a runtime without memory statistics: several exception types
        return None
