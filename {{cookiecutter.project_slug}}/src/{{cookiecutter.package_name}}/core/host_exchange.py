"""Host-side exchanges between a job's processes: small integers and barriers over a gloo
group, no device work (the stop flags, the agreed checkpoints), and the quiet set-up of that
group."""

from __future__ import annotations

import contextlib
import glob
import os
import sys
from collections.abc import Iterator
from typing import Any


def has_tpu_devices() -> bool:
    """True when this host has TPU device files (nothing is opened or started)."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


@contextlib.contextmanager
def stdout_silenced() -> Iterator[None]:
    """Send what native code writes to file descriptor 1 to /dev/null for a moment (gloo
    prints a line per connection there)."""
    sys.stdout.flush()
    saved = os.dup(1)
    with open(os.devnull, "w") as sink:
        os.dup2(sink.fileno(), 1)
        try:
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def all_reduce_max(value: int, group: Any) -> int:
    """The largest of every process's `value` over `group`."""
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return int(tensor.item())


def barrier(group: Any) -> None:
    """Wait for every process of `group`."""
    import torch.distributed as dist

    dist.barrier(group=group)


def all_gather_objects(value: Any, group: Any) -> list[Any]:
    """Every process's `value` (any picklable object) over `group`, in rank order."""
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, value, group=group)
    return gathered
