"""What the training step compiled once and run again takes and reports, whatever the
backend: the backend's `replay.ReplayedStep` is a `CompiledStep` that says how the step is
compiled and run (`_prepare`, `__call__`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch


class CompiledStep:
    """`step(inputs)` runs `fn(inputs)`, one training step, compiled once.

    `state()` lists every tensor the step may read or update in place (parameters,
    buffers, optimizer state); `inputs` is a nest of tensors that differ at each call
    (batches, learning rates). `host_read()` wraps a device read the run's guard must
    allow. With a `reason` the step is never compiled once and run again, and the reason
    is reported.
    """

    def __init__(
        self,
        fn: Callable[[Any], Any],
        state: Callable[[], list[torch.Tensor]],
        host_read: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
        reason: str | None = None,
    ) -> None:
        self.fn = fn
        self.state = state
        self.host_read = host_read or contextlib.nullcontext
        self.reason = reason  # why the step is not compiled once (None: it is)
        self.reads = 0  # device reads made while the step warmed up (reported)
        self.phase = "capture"
        self._prepare()

    def _prepare(self) -> None:
        """Set up what the backend keeps of the step (after the arguments are stored)."""

    def __call__(self, inputs: Any) -> Any:
        raise NotImplementedError
