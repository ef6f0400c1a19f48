"""Activation memory read from the model itself: what autograd keeps for the backward pass.

The task's loss runs forward on the meta device (shapes, no memory, no compute) under
`torch.autograd.graph.saved_tensors_hooks`, which sees every tensor autograd saves: what a
training step holds between its forward and its backward pass. Each saved storage counts
once, at its full size (a view keeps its whole base alive). Parameters are not activations;
a copy of one (the bf16 cast autocast makes for a matmul) is counted apart, laid out like
its parameter. Two more things are noted while the forward runs:

- where a tensor is saved: outside the repeated blocks, inside block i, or as a block's
  input (what activation checkpointing keeps of a block; the rest it recomputes);
- whether the mesh's `tensor` axis splits it (`tracking.py`), block outputs pinned whole
  as the run pins them.

Under bf16-mixed the tracker also makes the casts XLA's autocast would make.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from .tracking import ForwardTracker, storage_key
from .workload import Workload


@dataclass
class SavedStorage:
    """One storage autograd saved, and where: -1 outside the blocks, else a block's index."""

    nbytes: int
    split: bool  # over the tensor axis
    parameter: int | None  # a copy of this parameter (autocast's bf16 cast), else None
    itemsize: int
    places: set[int] = field(default_factory=set)


@dataclass
class Saved:
    """Bytes autograd keeps in one part of the forward pass, by how the mesh splits them."""

    whole: int = 0  # whole on each device that holds the batch shard
    split: int = 0  # split over the `tensor` axis
    copies: list[tuple[int, int]] = field(default_factory=list)  # (parameter, bytes/element)

    def add(self, storage: SavedStorage) -> None:
        if storage.parameter is not None:
            self.copies.append((storage.parameter, storage.itemsize))
        elif storage.split:
            self.split += storage.nbytes
        else:
            self.whole += storage.nbytes


@dataclass
class Recording:
    """What one forward pass of `samples` samples saved, sorted for both ways to train.

    Without checkpointing everything saved is kept. With it, the forward keeps each block's
    inputs and what is saved outside the blocks; the backward recomputes one block at a
    time, which then holds what that block saves (again, if the block's output is also
    saved outside it).
    """

    samples: int
    kept: Saved
    outside: Saved
    block_inputs: Saved
    blocks: list[Saved]


def record(
    workload: Workload, samples: int, split_weights: Mapping[int, bool], autocast: bool
) -> Recording:
    """Run the loss forward on `samples` samples and sort what autograd saves.

    `split_weights`: the parameters the tensor axis splits, True where it splits their first
    (output) dimension.
    """
    params = {storage_key(p): i for i, p in enumerate(workload.tensors)}
    tracker = ForwardTracker(params, split_weights, autocast)
    saved: dict[int, SavedStorage] = {}
    inputs: dict[int, SavedStorage] = {}
    where = [-1]
    keep: list[torch.Tensor] = []  # alive until the end: storage addresses stay unique

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        keep.append(tensor)
        key = storage_key(tensor)
        if key in params:  # the parameter itself: counted as a parameter
            return tensor
        if key not in saved:
            saved[key] = SavedStorage(
                tensor.untyped_storage().nbytes(), tracker.is_split(tensor),
                tracker.copies.get(key), tensor.element_size(),
            )  # fmt: skip
        saved[key].places.add(where[-1])
        return tensor

    try:
        with (
            _block_hooks(workload, tracker, where, inputs),
            tracker,
            torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
        ):
            workload.loss(workload.batch(samples))
    except (RuntimeError, NotImplementedError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(
            f"the loss of task {workload.task.name!r} does not run on the meta device, so its "
            f"activations cannot be recorded: {first}"
        ) from None
    recording = Recording(samples, Saved(), Saved(), Saved(), [Saved() for _ in workload.blocks])
    for storage in inputs.values():
        recording.block_inputs.add(storage)
    for key, storage in saved.items():
        recording.kept.add(storage)
        if key not in inputs:
            for place in storage.places:
                (recording.blocks[place] if place >= 0 else recording.outside).add(storage)
    return recording


@contextmanager
def _block_hooks(
    workload: Workload, tracker: ForwardTracker, where: list[int], inputs: dict[int, SavedStorage]
) -> Iterator[None]:
    """Note which block runs, what each block takes in, and pin block and model outputs
    whole over the tensor axis, as the run does."""

    def enter(index: int) -> Callable[..., None]:
        def hook(_: Any, args: Any, kwargs: Any) -> None:
            where.append(index)
            for tensor in tree_leaves((args, kwargs)):
                if isinstance(tensor, torch.Tensor) and tracker.parameter_of(tensor) is None:
                    key = storage_key(tensor)
                    if key not in inputs:
                        inputs[key] = SavedStorage(
                            tensor.untyped_storage().nbytes(), tracker.split.get(key, False),
                            None, tensor.element_size(),
                        )  # fmt: skip

        return hook

    def leave(_: Any, args: Any, output: Any) -> None:
        where.pop()
        pin(_, args, output)

    def pin(_: Any, args: Any, output: Any) -> None:
        tracker.mark([t for t in tree_leaves(output) if isinstance(t, torch.Tensor)], False)

    handles = [workload.model.register_forward_hook(pin)]
    for index, block in enumerate(workload.blocks):
        handles.append(block.register_forward_pre_hook(enter(index), with_kwargs=True))
        handles.append(block.register_forward_hook(leave))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
