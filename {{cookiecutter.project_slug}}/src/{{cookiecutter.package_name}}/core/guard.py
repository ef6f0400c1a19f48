"""The step guard and the counters it judges, whatever the backend.

The backend's `health` module reads its runtime's counters into a `HealthSnapshot`; its
`StepGuard` is a `GuardBase` told how to read them, what a new graph means there and what a
device-to-host read is called. The guard fails a block that compiles after warm-up or reads
the device more often than it allows; `diagnose` says the same of a whole run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, ClassVar, TypeVar


class HealthError(AssertionError):
    """Raised by the step guard (`StepGuard`) when a run compiles a graph after warm-up,
    falls back to CPU, or reads the device where it must not."""


def _grown(now: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    """The names whose count went up, by how much."""
    return {
        name: count - before.get(name, 0)
        for name, count in now.items()
        if count > before.get(name, 0)
    }


@dataclass(frozen=True)
class HealthSnapshot:
    """Cumulative counters at one moment: graphs compiled, device-to-host transfers, and
    by name the CPU fallback ops (torch_xla) and the graph breaks (torch.compile)."""

    compilations: int
    transfers: int
    fallback_ops: dict[str, int] = field(default_factory=dict)
    graph_breaks: dict[str, int] = field(default_factory=dict)

    def since(self, earlier: HealthSnapshot) -> HealthSnapshot:
        return HealthSnapshot(
            compilations=self.compilations - earlier.compilations,
            transfers=self.transfers - earlier.transfers,
            fallback_ops=_grown(self.fallback_ops, earlier.fallback_ops),
            graph_breaks=_grown(self.graph_breaks, earlier.graph_breaks),
        )


def all_finite(tensors: list[Any]) -> bool:
    """True if no element of any tensor is NaN or infinite (one reduction, one host read)."""
    import torch

    if not tensors:
        return True
    flags = torch.stack([torch.isfinite(t).all() for t in tensors])
    return bool(flags.all().item())


_Guard = TypeVar("_Guard", bound="GuardBase")


class GuardBase:
    """Fail fast when, inside the block, a graph compiles or the step reads the device.

    `allowed_transfers` permits the reads of a logging cadence; `allow()` adds to it
    while the block runs (the trainer does, for each deliberate host read). The backend's
    guard reads its counters (`_snapshot`), cuts the device's pending work where `sync=True`
    asks for it (`_sync`), and says what its graphs and reads mean (`_graph_problems`,
    `_graph_findings`, `_read_findings`).
    """

    # How the guard's error begins, and what a device-to-host read is called.
    label: ClassVar[str] = "step guard"
    transfer: ClassVar[str] = "device-to-host read"

    def __init__(
        self, allowed_transfers: int = 0, allowed_compilations: int = 0, sync: bool = False
    ) -> None:
        self.allowed_transfers = allowed_transfers
        self.allowed_compilations = allowed_compilations
        self.sync = sync
        self.start: HealthSnapshot | None = None
        self.delta: HealthSnapshot | None = None

    def __enter__(self: _Guard) -> _Guard:
        if self.sync:
            self._sync()
        self.start = self._snapshot()
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
            self._sync()
        self.check()

    def allow(self, transfers: int) -> None:
        """Permit `transfers` more device-to-host reads (a deliberate host read)."""
        self.allowed_transfers += transfers

    def _delta(self) -> HealthSnapshot:
        assert self.start is not None, f"{type(self).__name__}.check() called outside its block"
        return self._snapshot().since(self.start)

    def check(self) -> None:
        """Raise HealthError naming every cause seen since the block began."""
        self.delta = self._delta()
        problems = self._graph_problems(self.delta)
        if self.delta.transfers > self.allowed_transfers:
            problems.append(
                f"{self.delta.transfers} {self.transfer}(s), {self.allowed_transfers} "
                "allowed: a host sync (.item(), print, bool(tensor)) runs in the step"
            )
        if problems:
            raise HealthError(f"{self.label}: " + "; ".join(problems))

    @classmethod
    def diagnose(
        cls,
        delta: HealthSnapshot,
        steps: int,
        expected_graphs: int = 2,
        expected_transfers: int | None = None,
    ) -> list[str]:
        """Plain-language findings about a run's counters (empty when healthy).

        `expected_transfers` counts the deliberate host reads (logging, eval totals,
        checkpoints); without it, up to one read per step passes as logging.
        """
        findings = cls._graph_findings(delta, expected_graphs)
        allowed = steps if expected_transfers is None else expected_transfers
        if steps and delta.transfers > allowed:
            findings.append(
                f"{delta.transfers} {cls.transfer}s over {steps} steps, {allowed} expected: "
                "a host sync (.item(), print, Python branching on a tensor) runs in the step"
            )
        return findings + cls._read_findings(delta)

    # ---- the backend's part ----------------------------------------------------------
    def _snapshot(self) -> HealthSnapshot:
        """The runtime's counters now."""
        raise NotImplementedError

    def _sync(self) -> None:
        """Cut the work pending on the device, so that it is counted (nothing by default)."""

    def _graph_problems(self, delta: HealthSnapshot) -> list[str]:
        """What the block's graphs did wrong: compiled after warm-up, fell back to CPU."""
        raise NotImplementedError

    @classmethod
    def _graph_findings(cls, delta: HealthSnapshot, expected_graphs: int) -> list[str]:
        """What a whole run's graphs did wrong, said before its device reads (none here)."""
        return []

    @classmethod
    def _read_findings(cls, delta: HealthSnapshot) -> list[str]:
        """Device reads the counters name, said after their count (none here)."""
        return []
