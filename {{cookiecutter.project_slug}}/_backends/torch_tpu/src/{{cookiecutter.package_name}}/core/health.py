"""Step health under torch.compile: compiled graphs, recompiles, graph breaks, host reads.

Counted from dynamo's own counters: every graph it compiles (`unique_graphs`: the first
compilations and every recompilation after them), the graph breaks that split the step and
why, and the device reads this project makes on purpose (logging, eval totals, checkpoint
checks). A device read inside the compiled step is a graph break dynamo names (`.item()`,
a branch on a tensor): it is reported with the graph breaks, and a graph compiled after
warm-up fails the guard (`StepGuard`, raising `HealthError`) as it does under torch_xla.
"""

from __future__ import annotations

from typing import Any

from . import guard
from .guard import GuardBase, HealthSnapshot
from .guard import HealthError as HealthError

_transfers = 0
# Graph-break reasons that are reads of a device value on the host.
_READS = ("item()", "Tensor.item", "data-dependent", "data dependent", "tolist", "__bool__")


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
    """True if no element of any tensor is NaN or infinite (one reduction, one host read);
    a sharded (DTensor) tensor is checked on this process's shard."""
    if tensors:
        count_transfer()
    return guard.all_finite([_local(t) for t in tensors])


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


class StepGuard(GuardBase):
    """The step guard over dynamo's counters: a graph compiled after warm-up is reported
    with the graph breaks that came with it."""

    def _snapshot(self) -> HealthSnapshot:
        return snapshot()

    def _graph_problems(self, delta: HealthSnapshot) -> list[str]:
        if delta.compilations <= self.allowed_compilations:
            return []
        breaks = "; ".join(delta.graph_breaks) or "no new graph break"
        return [
            f"{delta.compilations} new graph(s) compiled after warm-up: a shape, dtype "
            f"or Python value changed between steps ({breaks}); TORCH_LOGS=recompiles "
            "prints each recompilation's cause"
        ]

    @classmethod
    def _read_findings(cls, delta: HealthSnapshot) -> list[str]:
        """The graph breaks that read the device inside the compiled step.

        The run's graph count is not judged here: torch.compile splits a step at backward()
        and inside the optimizer, so the loop's graphs are compared with what its first
        steps compiled (the guard), not with an expected number.
        """
        reads = [r for r in delta.graph_breaks if any(word in r for word in _READS)]
        return [f"the compiled step reads the device: {'; '.join(reads)}"] if reads else []


# Plain-language findings about a run's counters (empty when healthy).
diagnose = StepGuard.diagnose
