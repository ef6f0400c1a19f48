"""Profiler capture with torch.profiler, in TensorBoard's profile-plugin layout."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

# The capture recording, and when its time is up (monotonic clock).
_active: list[tuple[Any, float]] = []


def start_server(port: int) -> None:
    """Nothing to start: torch.profiler records in this process."""


def capture(logdir: Path, duration_ms: int, port: int) -> None:
    """Record the next `duration_ms` into `logdir/plugins/profile/`; `tick` writes the trace.

    On a TPU the trace holds TorchTPU's device activity where its profiler reports it; on
    the CPU stand-in, host activity only.
    """
    import torch.profiler as tp

    folder = logdir / "plugins" / "profile"
    folder.mkdir(parents=True, exist_ok=True)
    profiler = tp.profile(on_trace_ready=tp.tensorboard_trace_handler(str(folder)))
    profiler.start()
    _active.append((profiler, time.monotonic() + max(1, duration_ms) / 1000))


def tick(final: bool = False) -> None:
    """Stop the capture once its time is up (or the run ends: `final`) and write its trace.

    Called from the training loop: torch.profiler keeps its session per thread, so it stops
    in the thread that started it (from another one it finds no session, and can crash).
    """
    for profiler, ends in list(_active):
        if final or time.monotonic() >= ends:
            _active.remove((profiler, ends))
            profiler.stop()


def traces(logdir: Path) -> list[Path]:
    """Trace files written under `logdir`."""
    return sorted((logdir / "plugins" / "profile").glob("*.pt.trace.json"))


def device_kind() -> str:
    """What a trace can show here: 'TPU' or 'CPU' (host only)."""
    from .runtime import accelerator

    return "TPU" if accelerator() == "tpu" else "CPU"
