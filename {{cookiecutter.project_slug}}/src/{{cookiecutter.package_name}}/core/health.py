"""XLA health: compilations, CPU fallback ops, device-to-host transfers, and a guard."""

from __future__ import annotations

from .guard import GuardBase, HealthSnapshot
from .guard import HealthError as HealthError
from .guard import all_finite as all_finite


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


def metrics_report() -> str:
    """torch_xla's full metrics report."""
    import torch_xla.debug.metrics as met

    return str(met.metrics_report())


def _counts(ops: dict[str, int]) -> str:
    return ", ".join(f"{k} x{v}" for k, v in sorted(ops.items()))


class StepGuard(GuardBase):
    """Fail fast when, inside the block, XLA compiles a new graph, falls back, or syncs.

    With `sync=True` pending work is cut before the block and inside it at the end, so
    compilations are charged to the code that caused them.
    """

    label = "XLA guard"
    transfer = "device-to-host transfer"

    def _snapshot(self) -> HealthSnapshot:
        return snapshot()

    def _sync(self) -> None:
        import torch_xla

        torch_xla.sync()

    def _graph_problems(self, delta: HealthSnapshot) -> list[str]:
        problems = []
        if delta.compilations > self.allowed_compilations:
            problems.append(
                f"{delta.compilations} new graph(s) compiled after warm-up: a shape or "
                "Python branch changed between steps (ragged batch? variable length?); "
                "PT_XLA_DEBUG_LEVEL=1 prints each compilation's cause"
            )
        if delta.fallback_ops:
            problems.append(
                f"CPU fallback op(s) executed: {_counts(delta.fallback_ops)} (use XLA-lowered ops)"
            )
        return problems

    @classmethod
    def _graph_findings(cls, delta: HealthSnapshot, expected_graphs: int) -> list[str]:
        findings = []
        if delta.compilations > expected_graphs:
            findings.append(
                f"{delta.compilations} graphs compiled for {expected_graphs} expected: shapes or "
                "Python control flow change between steps (pad to static shapes, drop ragged "
                "batches)"
            )
        if delta.fallback_ops:
            ops = _counts(delta.fallback_ops)
            findings.append(f"CPU fallback ops ran: {ops} (rewrite them with XLA-lowered ops)")
        return findings


# Plain-language findings about a run's counters (empty when healthy).
diagnose = StepGuard.diagnose
