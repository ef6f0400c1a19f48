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
        # dynamo notes, once per compiled frame, that it drops profiler ranges: noise.
        logging.getLogger("torch._logging._internal").setLevel(logging.ERROR)
        self._compiled = torch.compile(self.fn, backend=self.backend, dynamic=False)

    def __call__(self, inputs: Any) -> Any:
        if self._compiled is None:
            return self.fn(inputs)
        out = self._compiled(inputs)
        self.phase = "replay"
        return out
