"""Gated: another task whose training stops at a gate the test holds (tests/gates.py).

The tests copy this module into a copy of the package as `tasks/gated.py`, as a user adds a
task. Options: `inner` (the task trained), `gate` (a FIFO), `gate_after` (training steps
before the gate); the rest go to the inner task. The loop calls the task's loss once per
step on the device (no gradient accumulation), on its own thread, in step order: the first
`gate_after` steps run at once, and the next one touches `<gate>.reached` and waits inside
its loss until the test releases the gate. However far the data is read ahead, the run is
provably inside that step, and cannot finish before the test lets it. Everything else is
the inner task's, unchanged, so losses equal an inner task's run.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

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


class GatedTask:
    """The inner task, its training loss waiting at the gate in step `after + 1`."""

    name = "gated"

    def __init__(self, inner: Task, gate: str, after: int) -> None:
        self.inner = inner
        self.gate = gate
        self.after = after
        self.steps = 0  # losses computed on the device: training steps

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        # FLOP counting runs the loss once on the meta device: not a step.
        if next(iter(batch.values())).device.type == "xla":
            self.steps += 1
            if self.steps == self.after + 1:
                wait_at(self.gate)
        return self.inner.loss(model, batch)


def make_task(
    data: str = "", inner: str = "", gate: str = "", gate_after: int = 0, **options: Any
) -> GatedTask:
    return GatedTask(load_task(inner, data, options), gate, gate_after)
