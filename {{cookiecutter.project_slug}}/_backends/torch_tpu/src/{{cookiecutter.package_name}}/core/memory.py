"""Bytes of parameters and optimizer state, in total and on the fullest device.

Read from each tensor's layout, so nothing is transferred: a DTensor (FSDP2, tensor
parallel) costs each device its local shard; a plain tensor is whole on its device.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


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


def _total(tensors: Iterable[torch.Tensor]) -> tuple[int, int]:
    whole = per_device = 0
    for tensor in tensors:
        all_bytes, device_bytes = tensor_bytes(tensor)
        whole += all_bytes
        per_device += device_bytes
    return whole, per_device


def state_memory(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, int]:
    """Parameter and optimizer-state bytes, in total and per device (this process's shard)."""
    params = _total(model.parameters())
    state = _total(
        value
        for entry in (optimizer.state.values() if optimizer is not None else ())
        for value in entry.values()
        if torch.is_tensor(value) and value.dim()
    )
    return {
        "param_bytes_total": params[0],
        "param_bytes_per_device": params[1],
        "optimizer_bytes_total": state[0],
        "optimizer_bytes_per_device": state[1],
        "state_bytes_total": params[0] + state[0],
        "state_bytes_per_device": params[1] + state[1],
    }


def device_peak_bytes(device: Any) -> int | None:
    """Peak bytes the device has held, where its runtime reports it (a TPU; not the CPU)."""
    kind = getattr(device, "type", str(device))
    if kind == "cpu":
        return None
    try:
        return int(torch.get_device_module(kind).max_memory_allocated())
    except Exception:  # a runtime without memory statistics: several exception types
        return None


def describe(state: dict[str, int], peak: int | None = None) -> str:
    """One line for the start-of-run report."""
    line = (
        f"parameters + optimizer state: {human(state['state_bytes_per_device'])} on the "
        f"fullest device, {human(state['state_bytes_total'])} in total"
    )
    return line + (f"; device peak {human(peak)}" if peak is not None else "")


def human(count: int) -> str:
    """Bytes as KiB/MiB/GiB for the report."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    return f"{value:.1f} GiB"
