"""The slices of a pod and their workers: one TPU node per slice, every worker a host to reach.

One slice is the TPU named NAME. N slices are the N nodes of one queued resource created
with `--node-count N --node-prefix NAME`, which Cloud TPU names NAME-0 ... NAME-(N-1)
(the API's MultisliceParams.nodeIdPrefix), all of one accelerator type.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..core.multislice import MultisliceError, check_slices, parse_slice_count
from .target import PodError, Target


@dataclass(frozen=True)
class Host:
    """One worker of one slice: the node it belongs to and its index there."""

    target: Target
    worker: int
    slice: int = 0
    slices: int = 1

    @property
    def label(self) -> str:
        """How its output lines are marked: `worker 1`, or `slice 1 worker 0` of several."""
        if self.slices == 1:
            return f"worker {self.worker}"
        return f"slice {self.slice} worker {self.worker}"


def requested_slices(text: str, accelerator_type: str = "") -> int:
    """The slice count asked for, refused when the accelerator type cannot form it."""
    try:
        slices = parse_slice_count(text)
        check_slices(accelerator_type, slices)
    except MultisliceError as error:
        raise PodError(str(error)) from None
    return slices


def nodes(target: Target, slices: int) -> list[Target]:
    """The TPU node of each slice: the target itself, or NAME-0 ... NAME-(N-1)."""
    if slices == 1:
        return [target]
    return [replace(target, name=f"{target.name}-{index}") for index in range(slices)]


def hosts(slice_nodes: list[Target], workers: list[int]) -> list[Host]:
    """Every worker of every slice, slice by slice; `workers[s]` is slice s's worker count."""
    count = len(slice_nodes)
    return [
        Host(node, worker, index, count)
        for index, (node, size) in enumerate(zip(slice_nodes, workers, strict=True))
        for worker in range(size)
    ]
