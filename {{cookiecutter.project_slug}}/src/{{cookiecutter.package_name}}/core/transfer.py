"""Batches onto the device, ahead of the step that needs them (torch_xla)."""

from __future__ import annotations

import atexit
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from . import runtime

# Why a batch must hold tensors alone (check_batch's refusal).
ONLY_TENSORS = "XLA devices take only tensors"


def device_batches(
    source: Iterable[Any], batches_per_execution: int, sharding: Any
) -> Iterator[Any]:
    """torch_xla's ParallelLoader over `source` (what MpDeviceLoader wraps): it uploads
    batches ahead in background threads (laid out by `sharding` under SPMD) and cuts the
    graph before every `batches_per_execution`-th batch (one batch, one step; never: the
    caller cuts it with `torch_xla.sync()` where its step ends, e.g. after the last
    accumulated micro-batch). Its threads are stopped and joined when the batches are
    dropped, and at the latest before the interpreter ends: a daemon thread cut off inside
    torch_xla's C++ code as Python finalizes aborts the process."""
    import torch_xla.distributed.parallel_loader as pl

    device = runtime.device()
    loader = pl.ParallelLoader(
        source, [device], batches_per_execution=batches_per_execution, input_sharding=sharding
    )
    _open.add(loader)
    try:
        yield from loader.per_device_loader(device)
    finally:
        _closed(loader)


_open: set[Any] = set()  # loaders whose threads may still run


CLOSE_PATIENCE = 60.0  # for a thread to finish the batch it is reading


def _closed(loader: Any) -> None:
    """Stop the loader's threads and wait for them, a while at most: one may be blocked in
    a read that never ends."""
    if loader in _open:
        _open.discard(loader)
        closing = threading.Thread(target=loader.close, name="closing batches", daemon=True)
        closing.start()
        closing.join(CLOSE_PATIENCE)


@atexit.register
def _close_every_loader() -> None:
    for loader in list(_open):
        _closed(loader)
