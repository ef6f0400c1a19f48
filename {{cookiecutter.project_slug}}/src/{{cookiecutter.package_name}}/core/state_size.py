"""Bytes of parameters and optimizer state, summed whatever the backend, and the report's
line about them.

The backend's `memory` module says what one tensor costs (`tensor_bytes`: the whole
tensor's bytes and one device's) and which optimizer state lives on the devices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

TensorBytes = Callable[[torch.Tensor], tuple[int, int]]


def _total(tensors: Iterable[torch.Tensor], tensor_bytes: TensorBytes) -> tuple[int, int]:
    whole = per_device = 0
    for tensor in tensors:
        all_bytes, device_bytes = tensor_bytes(tensor)
        whole += all_bytes
        per_device += device_bytes
    return whole, per_device


def state_memory(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    tensor_bytes: TensorBytes,
    on_device: Callable[[torch.Tensor], bool],
) -> dict[str, int]:
    """Parameter and optimizer-state bytes, in total and per device, each tensor counted by
    `tensor_bytes`; of the optimizer's state, the tensors `on_device` accepts."""
    params = _total(model.parameters(), tensor_bytes)
    state = _total(
        (
            value
            for entry in (optimizer.state.values() if optimizer is not None else ())
            for value in entry.values()
            if torch.is_tensor(value) and on_device(value)
        ),
        tensor_bytes,
    )
    return {
        "param_bytes_total": params[0],
        "param_bytes_per_device": params[1],
        "optimizer_bytes_total": state[0],
        "optimizer_bytes_per_device": state[1],
        "state_bytes_total": params[0] + state[0],
        "state_bytes_per_device": params[1] + state[1],
    }


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
