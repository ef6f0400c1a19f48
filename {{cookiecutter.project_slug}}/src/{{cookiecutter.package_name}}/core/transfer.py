"""Batches onto the device, ahead of the step that needs them (torch_xla)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import runtime

# Why a batch must hold tensors alone (check_batch's refusal).
ONLY_TENSORS = "XLA devices take only tensors"


def device_batches(source: Iterable[Any], batches_per_execution: int, sharding: Any) -> Any:
    """torch_xla's MpDeviceLoader over `source`: it uploads batches ahead in a background
    thread (laid out by `sharding` under SPMD) and cuts the graph before every
    `batches_per_execution`-th batch (one batch, one step; never: the caller cuts it with
    `torch_xla.sync()` where its step ends, e.g. after the last accumulated micro-batch)."""
    import torch_xla.distributed.parallel_loader as pl

    return pl.MpDeviceLoader(
        source,
        runtime.device(),
        batches_per_execution=batches_per_execution,
        input_sharding=sharding,
    )
