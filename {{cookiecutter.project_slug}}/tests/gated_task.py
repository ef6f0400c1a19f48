"""Gated: another task whose training data stops at a gate the test holds (tests/gates.py).

The tests copy this module into a copy of the package as `tasks/gated.py`, as a user adds a
task. Options: `inner` (the task trained), `gate` (a FIFO), `gate_after` (training steps
before the gate), `grad_accum` (batches per step); the rest go to the inner task.

The gate is in the data, where Python runs at every step: the step itself is traced once
and then replayed, so Python inside the loss runs on the first steps only. The loader asks
the dataset for each batch at once (`__getitems__`); batches read on the main thread are
the loop's look at one sample batch before training, the others are the training batches,
read ahead on the feeder's thread. The read of the batch of step `gate_after + 1` touches
`<gate>.reached` and waits until the test releases the gate: the run cannot train that
step, nor finish, before the test lets it, however far ahead the rest was read. Everything
else is the inner task's, unchanged, so losses equal an inner task's run.
"""

from __future__ import annotations

import threading
from typing import Any

from torch.utils.data import Dataset, IterableDataset

from {{ cookiecutter.package_name }}.tasks import Batch, Task, load_task


def wait_at(gate: str) -> None:
    """Say that this process has reached the gate, then wait until the test releases it."""
    with open(gate + ".reached", "w"):
        pass
    try:
        with open(gate, "rb") as fifo:
            fifo.read()  # end-of-file once the test lets go
    except FileNotFoundError:
        pass  # released before this process got here, or a later run


class GatedData(Dataset[Batch]):
    """The inner training set; the read of training batch `at` waits at the gate."""

    def __init__(self, inner: Any, gate: str, at: int) -> None:
        self.inner, self.gate, self.at = inner, gate, at
        self.batches = 0  # training batches read (not on the main thread)

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Batch:
        return self.inner[index]  # type: ignore[no-any-return]

    def __getitems__(self, indices: list[int]) -> list[Batch]:
        if threading.current_thread() is not threading.main_thread():
            self.batches += 1
            if self.batches == self.at:
                wait_at(self.gate)
        return [self.inner[index] for index in indices]

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


class GatedTask:
    """The inner task, its training data waiting at the gate in step `after + 1`."""

    name = "gated"

    def __init__(self, inner: Task, gate: str, after: int, accum: int) -> None:
        self.inner, self.gate, self.after, self.accum = inner, gate, after, accum

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def train_dataset(self) -> GatedData:
        data = self.inner.train_dataset()
        if isinstance(data, IterableDataset):
            raise TypeError("the task gated gates map-style training sets only")
        return GatedData(data, self.gate, self.after * self.accum + 1)


def make_task(
    data: str = "",
    inner: str = "",
    gate: str = "",
    gate_after: int = 0,
    grad_accum: int = 1,
    **options: Any,
) -> GatedTask:
    return GatedTask(load_task(inner, data, options), gate, gate_after, grad_accum)
