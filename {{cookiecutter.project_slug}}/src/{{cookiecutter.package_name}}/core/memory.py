"""Bytes of parameters and optimizer state, in total and on the fullest device.

Read from each tensor's sharding annotation, so nothing is transferred: a tensor
sharded 8 ways costs each device an eighth (rounded up, as XLA pads shards).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import torch

from . import state_size
from .sharding import Spec
from .state_size import describe as describe
from .state_size import human as human

_TILES = re.compile(r"devices=\[([\d,]+)\]")


def _tiles(spec: str, dims: int) -> list[int]:
    """Shards per dimension from a sharding string such as `{devices=[8,1]0,...}`."""
    match = _TILES.search(spec)
    if not match:  # unsharded, replicated or on one device: whole on every device
        return [1] * dims
    return [int(n) for n in match[1].split(",")][:dims]  # extra tile dims are replicas


# Whether the counts include optimizer state scalars: a capturable AdamW's step counts are
# device tensors here.
SCALAR_STATE_COUNTED = True


def held_spec(spec: Spec, mesh: Mapping[str, int], in_block: bool) -> Spec:
    """How each device holds a parameter the rules lay out as `spec` (`in_block`: one of
    the model's repeated blocks'): as they say (XLA's sharding annotation is the rules'
    spec)."""
    return spec


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


def state_memory(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, int]:
    """Parameter and optimizer-state bytes, in total and per device (the largest shard)."""
    return state_size.state_memory(model, optimizer, tensor_bytes, _on_device)


def _on_device(tensor: torch.Tensor) -> bool:
    """Optimizer state on an XLA device (not what stays on the host)."""
    return tensor.device.type == "xla"


def device_peak_bytes(device: Any) -> int | None:
    """Peak bytes the device has held, where the runtime reports it (TPU; not XLA:CPU)."""
    try:
        import torch_xla.core.xla_model as xm

        info = xm.get_memory_info(device)
    except Exception:  # unimplemented on XLA:CPU; the runtime raises various types
        return None
    peak = info.get("peak_bytes_used") if isinstance(info, dict) else None
    return int(peak) if isinstance(peak, (int, float)) else None
