"""Watching a run: host reads the guard allows, the XLA guard, the step clock, the summary."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from typing import Any

from ..core import health, ops

# Steps before the step clock starts: the first ones compile.
TIMED_AFTER = 3


class RunWatch:
    """Counts what XLA does during the loop and fails fast when it goes wrong.

    `guard_after=N` arms a `StepGuard` once N steps (and, if the run evaluates, one
    eval) have run: from then a new graph, a CPU fallback op or a device read outside
    `host_read()` raises `HealthError` at the next logging step.
    """

    def __init__(self, guard_after: int | None, evaluates: bool) -> None:
        self.guard_after = guard_after
        self.evaluates = evaluates
        self.guard: health.StepGuard | None = None
        self.guard_armed_at: int | None = None
        self.guard_result: dict[str, int] | None = None
        self.clock: tuple[int, float] | None = None  # (step, time) the clock started at
        self.host_clock = 0.0  # this thread's CPU time when the clock started
        self.start = health.snapshot()
        self.start_step = 0
        self.started_at = time.perf_counter()
        self.compiled_before = 0.0
        self.deliberate = 0  # transfers made inside host_read() since the loop started
        self.loop_reads: int | None = None  # those of the loop alone, once it has ended
        self.loop: health.HealthSnapshot | None = None
        self.host_peak_in_loop = 0  # the process's peak resident bytes when the loop ended

    @contextlib.contextmanager
    def host_read(self, possible: bool = True) -> Iterator[None]:
        """A deliberate device-to-host read: counted, and allowed by the armed guard.

        `possible=False` says the block reads nothing this step (processes agree to stop
        only on the cadence), so nothing is counted: XLA's transfer count is a copy of up
        to 1024 timing samples, ~0.1 ms, dearer than the rest of a step's bookkeeping.
        """
        if not possible:
            yield
            return
        before = health.transfer_count()
        yield
        made = health.transfer_count() - before
        self.deliberate += made
        if self.guard is not None:
            self.guard.allow(made)

    def loop_started(self, step: int) -> None:
        ops.sync()
        self.start = health.snapshot()
        self.start_step = step
        self.deliberate = 0
        self.started_at = time.perf_counter()
        self.compiled_before = health.compile_seconds()

    def first_step(self) -> dict[str, float]:
        """Time to the end of the run's first step (compiling plus running it)."""
        ops.wait()
        return {
            "time_to_first_step_s": time.perf_counter() - self.started_at,
            "first_step_compile_s": health.compile_seconds() - self.compiled_before,
        }

    def after_step(self, step: int, evaluations: int) -> None:
        """Start the clock after warm-up; arm the guard once the run is warm."""
        if self.clock is None and step >= TIMED_AFTER:
            ops.sync()
            ops.wait()
            self.clock = (step, time.perf_counter())
            self.host_clock = time.thread_time()
        warm = self.guard_after is not None and step >= self.guard_after
        if self.guard is None and warm and (not self.evaluates or evaluations > 0):
            self.guard = health.StepGuard()
            self.guard.__enter__()
            self.guard_armed_at = step

    def check(self, step: int) -> None:
        """Raise HealthError now if the armed guard saw a problem (logging cadence)."""
        if self.guard is not None:
            try:
                self.guard.check()
            except health.HealthError as error:
                raise health.HealthError(f"step {step}: {error}") from None

    def loop_ended(self) -> None:
        """Close the loop's window: its counters, and the guard's verdict."""
        self.loop = health.snapshot().since(self.start)
        self.loop_reads = self.deliberate
        self.host_peak_in_loop = host_peak_bytes()
        guard = self.guard
        if guard is not None:
            guard.check()
            assert guard.delta is not None and self.guard_armed_at is not None
            self.guard_result = {
                "armed_at_step": self.guard_armed_at,
                "compilations": guard.delta.compilations,
                "transfers": guard.delta.transfers,
                "allowed_transfers": guard.allowed_transfers,
            }
            self.guard = None  # the final eval and save are outside the window

    def loop_counters(self) -> health.HealthSnapshot:
        """The loop's XLA counters (the whole run's until the loop has ended)."""
        return self.loop or health.snapshot().since(self.start)

    def steps_per_second(self, step: int) -> float:
        ops.wait()
        if self.clock is None or step <= self.clock[0]:
            return 0.0
        return (step - self.clock[0]) / (time.perf_counter() - self.clock[1])

    def host_ms_per_step(self, step: int) -> float:
        """The loop's own CPU time per timed step: what a fast device waits on between steps.

        The host thread's time, not the wall clock: waiting for the device costs none of it.
        """
        if self.clock is None or step <= self.clock[0]:
            return 0.0
        return (time.thread_time() - self.host_clock) * 1e3 / (step - self.clock[0])

    def counters(self) -> dict[str, Any]:
        """XLA counters of the whole run and of the loop alone, for the summary."""
        whole = health.snapshot().since(self.start)
        loop = self.loop_counters()
        return {
            "compile_seconds": round(health.compile_seconds() - self.compiled_before, 3),
            "compilations": whole.compilations,
            "fallback_ops": whole.fallback_ops,
            "loop_transfers": loop.transfers,
            "loop_compilations": loop.compilations,
            "guard": self.guard_result,
        }

    def report(self, reporter: Any, summary: dict[str, Any]) -> dict[str, Any]:
        """Print the run's findings, write summary.json, and return the summary."""
        for finding in summary.get("diagnosis", []):
            reporter.line(f"diagnosis: {finding}")
        for key in ("metrics_report", "profile"):
            if key in summary:
                reporter.line(f"{key.replace('_', ' ')}: {summary[key]}")
        path = reporter.summary(summary)
        if path is not None:
            reporter.line(
                f"{summary['status']}: {summary['steps']} steps; summary written to {path}"
            )
        return summary


class Preemption:
    """SIGTERM (a spot TPU being reclaimed) asks the run to save and stop.

    Once asked, the process keeps taking SIGTERM as that same request until it ends: a VM
    going down signals every process, and a launcher sends its own on, so a process may get
    another while it saves, after the loop; the default action would end it unsaved."""

    def __init__(self) -> None:
        self.requested = False

    def __enter__(self) -> Preemption:
        self.previous = signal.signal(signal.SIGTERM, self._request)
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.requested:
            signal.signal(signal.SIGTERM, self.previous)

    def _request(self, signum: int, frame: Any) -> None:
        self.requested = True


def host_peak_bytes() -> int:
    """This process's peak resident memory so far (on XLA:CPU the devices' buffers too)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS: bytes; else KiB
