"""Bytes of parameters and optimizer state, in total and on the fullest device.

Read from each tensor's sharding annotation, so nothing is transferred: a tensor
sharded 8 ways costs each device an eighth (rounded up, as XLA pads shards).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

import torch

_TILES = re.compile(r"devices=\[([\d,]+)\]")


def _tiles(spec: str, dims: int) -> list[int]:
    """Shards per dimension from a sharding string such as `{devices=[8,1]0,...}`."""
    match = _TILES.search(spec)
    if not match:  # unsharded, replicated or on one device: whole on every device
        return [1] * dims
    return [int(n) for n in match[1].split(",")][:dims]  # extra tile dims are replicas


def sharding_of(tensor: torch.Tensor) -> str:
    if tensor.device.type != "xla":
        return ""
    import torch_xla

    return str(torch_xla._XLAC._get_xla_sharding_spec(tensor))


def tensor_bytes(tensor: torch.Tensor) -> tuple[int, int]:
    """(bytes of the whole tensor, bytes one device holds)."""
    size = tensor.element_size()
    tiles = _tiles(sharding_of(tensor), tensor.dim())
    shard = math.prod(math.ceil(n / t) for n, t in zip(tensor.shape, tiles, strict=False))
    return tensor.numel() * size, shard * size


def _total(tensors: Iterable[torch.Tensor]) -> tuple[int, int]:
    whole = per_device = 0
    for tensor in tensors:
        all_bytes, device_bytes = tensor_bytes(tensor)
        whole += all_bytes
        per_device += device_bytes
    return whole, per_device


def state_memory(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, int]:
    """Parameter and optimizer-state bytes, in total and per device (the largest shard)."""
    params = _total(model.parameters())
    state = _total(
        value
        for entry in (optimizer.state.values() if optimizer is not None else ())
        for value in entry.values()
        if torch.is_tensor(value) and value.device.type == "xla"
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
    """Peak bytes the device has held, where the runtime reports it (TPU; not XLA:CPU)."""
    try:
        import torch_xla.core.xla_model as xm

        info = xm.get_memory_info(device)
    except Exception:  # unimplemented on XLA:CPU; the runtime raises various types
        return None
    peak = info.get("peak_bytes_used") if isinstance(info, dict) else None
    return int(peak) if isinstance(peak, (int, float)) else None


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
