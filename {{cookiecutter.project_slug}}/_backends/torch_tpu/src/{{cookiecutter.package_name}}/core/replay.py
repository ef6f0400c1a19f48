"""The training step compiled once with `torch.compile(dynamic=False)` and run again.

TorchTPU compiles with dynamo: the step's Python runs once to capture its graphs (forward
and loss, the backward pass autograd builds from them, the optimizer's update), then every
later call with inputs of the same shapes and dtypes runs the compiled graphs; a new shape
or a changed Python value recompiles, which `core/health.py` counts and the run's guard
refuses after warm-up. Dynamo breaks the step at `loss.backward()` and inside
`optimizer.step()` (torch's optimizers break deliberately): a few graphs, fixed in number
after the first steps. The compile backend is TorchTPU's `"tpu"` on a TPU (static shapes);
on the CPU stand-in, `aot_eager` (the same captured graphs, run by PyTorch's kernels:
exact), or `TORCH_COMPILE_BACKEND` (e.g. `inductor`). The learning rates are inputs of the
step (tensors), so the schedule never recompiles it. Its outputs (the loss and metrics)
are each process's; they are averaged over the data-parallel processes when they are read
(`ops.to_host`, on the logging cadence): the global batch's numbers.

The class keeps the torch_xla backend's name, and is a `CompiledStep` as that backend's is
(`core/compiled_step.py`): `training/step.py` builds either backend's step the same way.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from .compiled_step import CompiledStep

BACKEND_VARIABLE = "TORCH_COMPILE_BACKEND"


def compile_backend() -> str:
    """The dynamo backend: TorchTPU's on a TPU, else `aot_eager` (or TORCH_COMPILE_BACKEND)."""
    from .runtime import device

    if device().type == "tpu":
        return "tpu"
    return os.environ.get(BACKEND_VARIABLE) or "aot_eager"


# The dynamo modules whose warning that a profiler range "will be ignored" is dropped.
PROFILER_NOTES = ("torch._dynamo.variables.ctx_manager", "torch._dynamo.variables.torch")


def _drop_profiler_notes(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Profiler ")


class ReplayedStep(CompiledStep):
    """`step(inputs)`: `fn(inputs)` compiled on its first call, its graphs run after that.

    `state` and `host_read` are accepted for the torch_xla backend's interface; dynamo
    finds the state (parameters, buffers, optimizer state) itself. With a `reason` the
    step runs eagerly (`replay_step = false`: debugging).
    """

    def _prepare(self) -> None:
        self.backend = compile_backend()
        self._compiled: Callable[[Any], Any] | None = None
        if self.reason is not None:
            self.phase = "eager"
            return
        # dynamo notes, once per process, that it drops the profiler ranges torch's optimizers
        # open: noise on stderr (a refusal's one line became two).
        for name in PROFILER_NOTES:
            logging.getLogger(name).addFilter(_drop_profiler_notes)
        # Each run compiles its step afresh, as in a new process: dynamo keeps 8 compiled
        # versions of a function (`recompile_limit`), and from a process's ninth run on the
        # step would run eagerly, silently, and slowly.
        torch._dynamo.reset()
        self._compiled = torch.compile(self.fn, backend=self.backend, dynamic=False)

    def __call__(self, inputs: Any) -> Any:
        if self._compiled is None:
            return self.fn(inputs)
        out = self._compiled(inputs)
        self.phase = "replay"
        return out
