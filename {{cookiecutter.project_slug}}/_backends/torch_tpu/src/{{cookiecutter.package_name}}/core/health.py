"""Step health under torch.compile: compiled graphs, recompiles, graph breaks, host reads.

Counted from dynamo's own counters: every graph it compiles (`unique_graphs`: the first
compilations and every recompilation after them), the graph breaks that split the step and
why, and the device reads this project makes on purpose (logging, eval totals, checkpoint
checks). A device read inside the compiled step is a graph break dynamo names (`.item()`,
a branch on a tensor): it is reported with the graph breaks, and a graph compiled after
warm-up fails the guard as it does under torch_xla. The names of the torch_xla backend
(`XlaGuard`, `XlaHealthError`) are kept: the rest of the project speaks to one interface.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

_transfers = 0
# Graph-break reasons that are reads of a device value on the host.
_READS = ("item()", "Tensor.item", "data-dependent", "data dependent", "tolist", "__bool__")


class XlaHealthError(AssertionError):
    """Raised by `XlaGuard` when a run recompiles or reads the device where it must not."""


@dataclass(frozen=True)
class HealthSnapshot:
    """Cumulative counters at one moment."""

    compilations: int
    transfers: int
    fallback_ops: dict[str, int] = field(default_factory=dict)
    graph_breaks: dict[str, int] = field(default_factory=dict)

    def since(self, earlier: HealthSnapshot) -> HealthSnapshot:
        breaks = {
            reason: count - earlier.graph_breaks.get(reason, 0)
            for reason, count in self.graph_breaks.items()
            if count > earlier.graph_breaks.get(reason, 0)
        }
        return HealthSnapshot(
            compilations=self.compilations - earlier.compilations,
            transfers=self.transfers - earlier.transfers,
            fallback_ops={},
            graph_breaks=breaks,
        )


def count_transfer(count: int = 1) -> None:
    """Record a deliberate device-to-host read (the project's own reads call this)."""
    global _transfers
    _transfers += count


def _counters() -> Any:
    from torch._dynamo.utils import counters

    return counters


def _reason(text: str) -> str:
    """A graph break's reason, its first line."""
    return text.strip().splitlines()[0][:160] if text.strip() else "graph break"


def compile_seconds() -> float:
    """Seconds dynamo has spent compiling so far."""
    from torch._dynamo.utils import compilation_time_metrics

    return float(sum(compilation_time_metrics.get("_compile.compile_inner", [])))


def transfer_count() -> int:
    """Device-to-host reads so far: the deliberate ones, and graph breaks that read."""
    return _transfers + sum(
        count
        for reason, count in _counters()["graph_break"].items()
        if any(word in reason for word in _READS)
    )


def snapshot() -> HealthSnapshot:
    """Read the counters now."""
    counters = _counters()
    breaks: dict[str, int] = {}
    for reason, count in counters["graph_break"].items():
        key = _reason(reason)
        breaks[key] = breaks.get(key, 0) + int(count)
    return HealthSnapshot(
        compilations=int(counters["stats"]["unique_graphs"]),
        transfers=transfer_count(),
        graph_breaks=breaks,
    )


def all_finite(tensors: list[Any]) -> bool:
    """True if no element of any tensor is NaN or infinite (one reduction, one host read)."""
    import torch

    if not tensors:
        return True
    count_transfer()
    flags = torch.stack([torch.isfinite(_local(t)).all() for t in tensors])
    return bool(flags.all().item())


def _local(tensor: Any) -> Any:
    """A sharded (DTensor) parameter's own shard; others as they are."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def metrics_report() -> str:
    """dynamo's counters: graphs, graph breaks and their reasons, compile time."""
    counters = _counters()
    lines = [f"compiled graphs: {counters['stats']['unique_graphs']}"]
    lines.append(f"compile seconds: {compile_seconds():.2f}")
    lines.append(f"deliberate device reads: {_transfers}")
    for reason, count in sorted(snapshot().graph_breaks.items()):
        lines.append(f"graph break x{count}: {reason}")
    return "\n".join(lines)


def diagnose(
    delta: HealthSnapshot,
    steps: int,
    expected_graphs: int = 2,
    expected_transfers: int | None = None,
) -> list[str]:
    """Plain-language findings about a run's counters (empty when healthy).

    `expected_graphs` counts the graphs a healthy run compiles once; torch.compile splits a
    step at backward() and inside the optimizer, so the loop's graphs are compared with
    what its first steps compiled (the guard), not with this number alone.
    """
    findings = []
    allowed = steps if expected_transfers is None else expected_transfers
    if steps and delta.transfers > allowed:
        findings.append(
            f"{delta.transfers} device-to-host reads over {steps} steps, {allowed} expected: "
            "a host sync (.item(), print, Python branching on a tensor) runs in the step"
        )
    reads = [r for r in delta.graph_breaks if any(word in r for word in _READS)]
    if reads:
        findings.append(f"the compiled step reads the device: {'; '.join(reads)}")
    return findings


class XlaGuard:
    """Fail fast when, inside the block, a graph compiles or the step reads the device.

    `allowed_transfers` permits the reads of a logging cadence; `allow()` adds to it
    while the block runs (the trainer does, for each deliberate host read).
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
        self.check()

    def allow(self, transfers: int) -> None:
        """Permit `transfers` more device-to-host reads (a deliberate host read)."""
        self.allowed_transfers += transfers

    def _delta(self) -> HealthSnapshot:
        assert self.start is not None, "XlaGuard.check() called outside its block"
        return snapshot().since(self.start)

    def check(self) -> None:
        """Raise XlaHealthError naming every cause seen since the block began."""
        self.delta = self._delta()
        problems = []
        if self.delta.compilations > self.allowed_compilations:
            breaks = "; ".join(self.delta.graph_breaks) or "no new graph break"
            problems.append(
                f"{self.delta.compilations} new graph(s) compiled after warm-up: a shape, dtype "
                f"or Python value changed between steps ({breaks}); TORCH_LOGS=recompiles "
                "prints each recompilation's cause"
            )
        if self.delta.transfers > self.allowed_transfers:
            problems.append(
                f"{self.delta.transfers} device-to-host read(s), {self.allowed_transfers} "
                "allowed: a host sync (.item(), print, bool(tensor)) runs in the step"
            )
        if problems:
            raise XlaHealthError("step guard: " + "; ".join(problems))
