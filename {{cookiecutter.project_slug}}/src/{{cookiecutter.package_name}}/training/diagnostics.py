"""Profiler capture and the metrics-report diagnosis of a run, for the master process."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from ..core import health, profiling

# Steps timed after warm-up before a capture starts, to turn "N steps" into a duration.
PROBE_STEPS = 3
# The longest the run waits at its end for a capture still recording.
MAX_WAIT_SECONDS = 120.0


class Diagnostics:
    """Captures `profile_steps` steps into `run_dir/profile` and writes the metrics report."""

    def __init__(
        self, run_dir: Path, profile_steps: int, port: int, report: bool, enabled: bool
    ) -> None:
        self.profile_dir = run_dir / "profile"
        self.report_path = run_dir / "metrics_report.txt"
        self.profile_steps = profile_steps if enabled else 0
        self.port = port
        self.report = report and enabled
        self.capture_ends: float | None = None

    def after_step(self, step: int, timer: tuple[int, float] | None) -> None:
        """Start the capture once the post-warm-up step rate is known (host clock only), and
        let a capture under way stop when its time is up."""
        if self.capture_ends is not None:
            profiling.tick()
            return
        if not self.profile_steps or timer is None:
            return
        if step < timer[0] + PROBE_STEPS:
            return
        from ..core import ops

        ops.wait()
        seconds_per_step = (time.perf_counter() - timer[1]) / (step - timer[0])
        duration_ms = math.ceil(self.profile_steps * seconds_per_step * 1000)
        profiling.capture(self.profile_dir, duration_ms, self.port)
        self.capture_ends = time.monotonic() + duration_ms / 1000

    def finish(
        self, loop: health.HealthSnapshot, steps: int, graphs: int, reads: int | None = None
    ) -> dict[str, Any]:
        """Wait for a capture, write the report if asked, and return what to summarise."""
        result: dict[str, Any] = {"diagnosis": health.diagnose(loop, steps, graphs, reads)}
        if self.capture_ends is not None:
            profiling.tick(final=True)  # the run is over: so is what a capture can record
            deadline = min(self.capture_ends + 5.0, time.monotonic() + MAX_WAIT_SECONDS)
            while not profiling.traces(self.profile_dir) and time.monotonic() < deadline:
                time.sleep(0.2)
            result["profile"] = {
                "dir": str(self.profile_dir),
                "traces": [str(p) for p in profiling.traces(self.profile_dir)],
                "device": profiling.device_kind(),
            }
        if self.report:
            findings = result["diagnosis"] or ["no recompilation, fallback op or host sync found"]
            lines = "\n".join(f"- {finding}" for finding in findings)
            text = f"{health.metrics_report()}\n# Diagnosis\n{lines}"
            self.report_path.parent.mkdir(parents=True, exist_ok=True)
            self.report_path.write_text(text + "\n")
            result["metrics_report"] = str(self.report_path)
        return result
