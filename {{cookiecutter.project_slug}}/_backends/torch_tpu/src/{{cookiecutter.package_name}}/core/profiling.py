"""Profiler capture with torch.profiler, in TensorBoard's profile-plugin layout."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

_active: list[Any] = []


def start_server(port: int) -> None:
    """Nothing to start: torch.profiler records in this process."""


def capture(logdir: Path, duration_ms: int, port: int) -> None:
    """Record the next `duration_ms` into `logdir/plugins/profile/`, then write the trace.

    On a TPU the trace holds TorchTPU's device activity where its profiler reports it; on
    the CPU stand-in, host activity only.
    """
    import torch.profiler as tp

    folder = logdir / "plugins" / "profile"
    folder.mkdir(parents=True, exist_ok=True)
    profiler = tp.profile(on_trace_ready=tp.tensorboard_trace_handler(str(folder)))
    profiler.start()
    _active.append(profiler)
    timer = threading.Timer(max(1, duration_ms) / 1000, _stop, args=(profiler,))
    timer.daemon = True
    timer.start()


def _stop(profiler: Any) -> None:
    if profiler in _active:
        _active.remove(profiler)
        profiler.stop()


def traces(logdir: Path) -> list[Path]:
    """Trace files written under `logdir`."""
    return sorted((logdir / "plugins" / "profile").glob("*.pt.trace.json"))


def device_kind() -> str:
    """What a trace can show here: 'TPU' or 'CPU' (host only)."""
    from .runtime import accelerator

    return "TPU" if accelerator() == "tpu" else "CPU"
