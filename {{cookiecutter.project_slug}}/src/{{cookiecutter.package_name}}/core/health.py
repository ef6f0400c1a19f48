"""XLA health: compilations, CPU fallback ops, device-to-host transfers, and a guard."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import TracebackType
from typing import Any


class XlaHealthError(AssertionError):
    """Raised by `XlaGuard` when a run recompiles, falls back to CPU, or syncs to host."""


@dataclass(frozen=True)
class HealthSnapshot:
    """Cumulative counters of the XLA runtime at one moment."""

    compilations: int
    transfers: int
    fallback_ops: dict[str, int] = field(default_factory=dict)

    def since(self, earlier: HealthSnapshot) -> HealthSnapshot:
        ops = {
            name: count - earlier.fallback_ops.get(name, 0)
            for name, count in self.fallback_ops.items()
            if count > earlier.fallback_ops.get(name, 0)
        }
        return HealthSnapshot(
            compilations=self.compilations - earlier.compilations,
            transfers=self.transfers - earlier.transfers,
            fallback_ops=ops,
        )


def _metric_count(name: str) -> int:
    import torch_xla.debug.metrics as met

    data = met.metric_data(name)
    return int(data[0]) if data else 0


def compile_seconds() -> float:
    """Seconds the runtime has spent compiling graphs so far (its CompileTime metric)."""
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    return float(data[1]) / 1e9 if data else 0.0


def transfer_count() -> int:
    """Device-to-host transfers so far (cheaper than a full snapshot)."""
    return _metric_count("TransferFromDeviceTime")


def _sync() -> None:
    import torch_xla

    torch_xla.sync()


def snapshot() -> HealthSnapshot:
    """Read the runtime's counters now."""
    import torch_xla.debug.metrics as met

    ops = {
        name: int(met.counter_value(name) or 0)
        for name in met.counter_names()
        # .item() shows up as an aten counter but is a transfer, counted below.
        if name.startswith("aten::") and name != "aten::_local_scalar_dense"
    }
    return HealthSnapshot(
        compilations=_metric_count("CompileTime"),
        transfers=_metric_count("TransferFromDeviceTime"),
        fallback_ops=ops,
    )


def all_finite(tensors: list[Any]) -> bool:
    """True if no element of any tensor is NaN or infinite (one reduction, one host read)."""
    import torch

    if not tensors:
        return True
    flags = torch.stack([torch.isfinite(t).all() for t in tensors])
    return bool(flags.all().item())


def metrics_report() -> str:
    """torch_xla's full metrics report."""
    import torch_xla.debug.metrics as met

    return str(met.metrics_report())


def diagnose(
    delta: HealthSnapshot,
    steps: int,
    expected_graphs: int = 2,
    expected_transfers: int | None = None,
) -> list[str]:
    """Plain-language findings about a run's counters (empty when healthy).

    `expected_transfers` counts the deliberate host reads (logging, eval totals,
    checkpoints); without it, up to one transfer per step passes as logging.
    """
    findings = []
    if delta.compilations > expected_graphs:
        findings.append(
            f"{delta.compilations} graphs compiled for {expected_graphs} expected: shapes or "
            "Python control flow change between steps (pad to static shapes, drop ragged batches)"
        )
    if delta.fallback_ops:
        ops = ", ".join(f"{k} x{v}" for k, v in sorted(delta.fallback_ops.items()))
        findings.append(f"CPU fallback ops ran: {ops} (rewrite them with XLA-lowered ops)")
    allowed = steps if expected_transfers is None else expected_transfers
    if steps and delta.transfers > allowed:
        findings.append(
            f"{delta.transfers} device-to-host transfers over {steps} steps, {allowed} "
            "expected: a host sync (.item(), print, Python branching on a tensor) runs in the step"
        )
    return findings


class XlaGuard:
    """Fail fast when, inside the block, XLA compiles a new graph, falls back, or syncs.

    `allowed_transfers` permits the transfers of a logging cadence; `allow()` adds to it
    while the block runs (the trainer does, for each deliberate host read). With
    `sync=True` pending work is cut before the block and inside it at the end, so
    compilations are charged to the code that caused them.
    """

    def __init__(
        self, allowed_transfers: int = 0, allowed_compilations: int = 0, sync: bool = False
    ) -> None:
        self.allowed_transfers = allowed_transfers
        self.allowed_compilations = allowed_compilations
        self.sync = sync
        self.start: HealthSnapshot | None = None
        self.delta: HealthSnapshot | None = None

    def __enter__(self) -> XlaGuard:
        if self.sync:
            _sync()
        self.start = snapshot()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.delta = self._delta()
            return
        if self.sync:
            _sync()
        self.check()

    def allow(self, transfers: int) -> None:
        """Permit `transfers` more device-to-host transfers (a deliberate host read)."""
        self.allowed_transfers += transfers

    def _delta(self) -> HealthSnapshot:
        assert self.start is not None, "XlaGuard.check() called outside its block"
        return snapshot().since(self.start)

    def check(self) -> None:
        """Raise XlaHealthError naming every cause seen since the block began."""
        self.delta = self._delta()
        problems = []
        if self.delta.compilations > self.allowed_compilations:
            problems.append(
                f"{self.delta.compilations} new graph(s) compiled after warm-up: a shape or "
                "Python branch changed between steps (ragged batch? variable length?); "
                "PT_XLA_DEBUG_LEVEL=1 prints each compilation's cause"
            )
        if self.delta.fallback_ops:
            ops = ", ".join(f"{k} x{v}" for k, v in sorted(self.delta.fallback_ops.items()))
            problems.append(f"CPU fallback op(s) executed: {ops} (use XLA-lowered ops)")
        if self.delta.transfers > self.allowed_transfers:
            problems.append(
                f"{self.delta.transfers} device-to-host transfer(s), {self.allowed_transfers} "
                "allowed: a host sync (.item(), print, bool(tensor)) runs in the step"
            )
        if problems:
            raise XlaHealthError("XLA guard: " + "; ".join(problems))
