"""Profiler capture and metrics reports, in TensorBoard's profile-plugin layout."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

_servers: dict[int, Any] = {}


def start_server(port: int) -> None:
    """Start torch_xla's profiler server in this process (once per port)."""
    if port not in _servers:
        import torch_xla.debug.profiler as xp

        _servers[port] = xp.start_server(port)


def capture(logdir: Path, duration_ms: int, port: int) -> None:
    """Capture a trace of the next `duration_ms` into `logdir/plugins/profile/...`.

    Runs in a background thread so training goes on while it records. On TPU the
    trace holds device activity; XLA:CPU records host and XLA:CPU activity only.
    """
    import torch_xla.debug.profiler as xp

    start_server(port)
    logdir.mkdir(parents=True, exist_ok=True)
    xp.trace_detached(f"localhost:{port}", str(logdir), duration_ms=max(1, duration_ms))


def tick(final: bool = False) -> None:
    """Nothing to do in the loop: torch_xla's capture stops and writes by itself."""


def traces(logdir: Path) -> list[Path]:
    """Trace files written under `logdir`."""
    return sorted((logdir / "plugins" / "profile").glob("*/*.xplane.pb"))


def device_kind() -> str:
    """What a trace can show here: 'TPU' (device timelines) or 'CPU' (host only)."""
    return "TPU" if os.environ.get("PJRT_DEVICE") == "TPU" else "CPU"
