"""Batches onto the device, ahead of the step that needs them (torch_tpu)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from . import runtime

# Why a batch must hold tensors alone (check_batch's refusal).
ONLY_TENSORS = "the device takes only tensors"


def device_batches(source: Iterable[Any], batches_per_execution: int, sharding: Any) -> Any:
    """Each batch of `source` moved to this process's device (`non_blocking`: the copy
    overlaps the step before it). One process per device holds its batch whole (no
    `sharding`), and eager PyTorch has no lazy graph to cut (`batches_per_execution`)."""
    return _on_device(source, runtime.device())


def _on_device(batches: Iterable[Any], device: Any) -> Iterator[Any]:
    for batch in batches:
        yield _moved(batch, device)


def _moved(batch: Any, device: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {key: _moved(value, device) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_moved(value, device) for value in batch)
    return batch
