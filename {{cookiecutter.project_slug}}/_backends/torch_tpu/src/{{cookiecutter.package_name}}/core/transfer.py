"""Batches onto the device, ahead of the step that needs them (torch_tpu)."""

from __future__ import annotations

import atexit
import queue
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from . import runtime

# Why a batch must hold tensors alone (check_batch's refusal).
ONLY_TENSORS = "the device takes only tensors"
AHEAD = 4  # host batches read while the steps before them run (MpDeviceLoader's way)
# How long a stopped reader may take to finish the batch it is reading.
READ_PATIENCE = 60.0


def device_batches(source: Iterable[Any], batches_per_execution: int, sharding: Any) -> Any:
    """Each batch of `source`, read ahead on a thread of its own (the host's reads overlap
    the steps), moved to this process's device (`non_blocking`: the copy overlaps the step
    before it). One process per device holds its batch whole (no `sharding`), and eager
    PyTorch has no lazy graph to cut (`batches_per_execution`)."""
    device = runtime.device()
    return (_moved(batch, device) for batch in _read_ahead(source, AHEAD))


class _Raised:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


def _read_ahead(batches: Iterable[Any], depth: int) -> Iterator[Any]:
    """`batches`, read by a thread up to `depth` ahead of the caller; the reader's error is
    raised here, and the thread stops when the caller stops early."""
    ahead: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                ahead.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for batch in batches:
                if not put(batch):
                    return
        except BaseException as error:  # raised again where the batch is taken
            put(_Raised(error))
            return
        put(_END)

    reader = threading.Thread(target=read, name="batches ahead", daemon=True)
    reader.start()
    _readers.add((stop, reader))
    try:
        while True:
            item = ahead.get()
            if item is _END:
                return
            if isinstance(item, _Raised):
                raise item.error
            yield item
    finally:
        _stopped(stop, reader)


# Readers not stopped yet: stopped before the interpreter ends. A daemon thread still inside
# torch when Python finalizes is cut off in C++ code, which aborts the process.
_readers: set[tuple[threading.Event, threading.Thread]] = set()


def _stopped(stop: threading.Event, reader: threading.Thread) -> None:
    stop.set()
    reader.join(READ_PATIENCE)
    _readers.discard((stop, reader))


@atexit.register
def _stop_every_reader() -> None:
    for stop, reader in list(_readers):
        _stopped(stop, reader)


def _moved(batch: Any, device: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {key: _moved(value, device) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_moved(value, device) for value in batch)
    return batch
