"""The records as intervals of time: what each category claims, and what none does (`other`).

Every category is measured by its own start and end records: the set-up phases, checkpoint
saves and restores, evaluations, the steps (from one step mark to the next), and recovery
(from the last step mark before a restart to the start of the attempt that restarted). The
steps are split into segments where ml-goodput-measurement sees a restart: a step number
recorded again. `other` is the wall time outside every claimed interval, so an account whose
categories add up to more or less than the seconds they claim does not sum to the wall time.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import store

Interval = tuple[float, float]
Mark = tuple[int, float]  # (step, time): the step count reached, as the library records it
SAVE_SECONDS = "checkpoint_manager_blocking_duration_secs"
RESTORE_SECONDS = "checkpoint_manager_duration_secs"


@dataclass
class Reading:
    """Every attempt's records as intervals, the steps in the library's segments."""

    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    phases: list[Interval] = field(default_factory=list)  # data loading, TPU init, preparation
    saves: list[Interval] = field(default_factory=list)
    restores: list[Interval] = field(default_factory=list)
    events: list[tuple[str, Interval]] = field(default_factory=list)  # evaluations
    segments: list[list[Mark]] = field(default_factory=list)
    # For each segment but the last: the step training restarted from, and the start of the
    # attempt that restarted.
    restarts: list[tuple[int, float | None]] = field(default_factory=list)

    def wasted(self) -> list[Interval]:
        """Steps past the step a restart went back to: trained again (wasted progress)."""
        found = []
        for segment, (restart, _) in zip(self.segments, self.restarts, strict=False):
            pairs = itertools.pairwise(segment)
            found += [(before[1], after[1]) for before, after in pairs if after[0] > restart]
        return found

    def recoveries(self) -> list[Interval]:
        """From a segment's last step mark to the start of the attempt that restarted."""
        found = []
        for segment, (_, started) in zip(self.segments, self.restarts, strict=False):
            if started is not None and started > segment[-1][1]:
                found.append((segment[-1][1], started))
        return found

    def tail(self) -> Interval | None:
        """From the last step mark to the job's end: the final evaluation, save, summary."""
        if not self.ends or not self.segments:
            return None
        return self.segments[-1][-1][1], self.ends[-1]

    def claimed(self) -> list[Interval]:
        """Every interval some category claims (steps hold their evaluations and saves)."""
        spans = [(segment[0][1], segment[-1][1]) for segment in self.segments]
        evaluations = [interval for _, interval in self.events]
        return [*self.phases, *self.restores, *spans, *self.recoveries(), *self.saves,
                *evaluations]  # fmt: skip

    def unclaimed(self, start: float, end: float) -> float:
        """The seconds of [start, end] that no category claims."""
        return (end - start) - covered(self.claimed(), start, end)


def read(entries: list[dict[str, Any]]) -> Reading:
    """The intervals of these entries; steps split where a step number repeats, as the
    library splits them."""
    reading = Reading()
    opened: dict[str, float] = {}
    segment: list[Mark] = []
    started: float | None = None
    for entry in sorted(entries, key=store.entry_time):
        if "job_start_time" in entry:
            started = float(entry["job_start_time"])
            reading.starts.append(started)
        elif "job_end_time" in entry:
            reading.ends.append(float(entry["job_end_time"]))
        elif "step_count" in entry:
            step, at = int(entry["step_count"]), float(entry["step_start_time"])
            if any(seen == step for seen, _ in segment):
                reading.segments.append(segment)
                reading.restarts.append((step, started))
                segment = []
            segment.append((step, at))
        elif entry.get("event_type") in ("save", "restore"):
            begun = float(entry["checkpoint_start_time"])
            save = entry["event_type"] == "save"
            seconds = float(entry[SAVE_SECONDS if save else RESTORE_SECONDS])
            (reading.saves if save else reading.restores).append((begun, begun + seconds))
        else:
            _phase_or_event(entry, opened, reading)
    if segment:
        reading.segments.append(segment)
    return reading


def _phase_or_event(entry: dict[str, Any], opened: dict[str, float], reading: Reading) -> None:
    """Pair a phase's or a custom event's start with the end that follows it."""
    key = next(name for name in entry if name.endswith("_time"))
    if "custom_badput_event_type" in entry:
        name = str(entry["custom_badput_event_type"]).lower()
        if key.endswith("_start_time"):
            opened[f"event:{name}"] = float(entry[key])
        elif f"event:{name}" in opened:
            interval = (opened.pop(f"event:{name}"), float(entry[key]))
            reading.events.append((name, interval))
    elif key.endswith("_start_time"):
        opened[key.removesuffix("_start_time")] = float(entry[key])
    elif key.endswith("_end_time") and key.removesuffix("_end_time") in opened:
        reading.phases.append((opened.pop(key.removesuffix("_end_time")), float(entry[key])))


def covered(intervals: Iterable[Interval], start: float, end: float) -> float:
    """The seconds of [start, end] inside at least one of the intervals."""
    total, reached = 0.0, start
    for low, high in sorted(intervals):
        low, high = max(low, reached), min(high, end)
        if high > low:
            total += high - low
            reached = high
    return total


def inside(intervals: Iterable[Interval], spans: Iterable[Interval]) -> float:
    """The seconds of the intervals that lie inside one of the spans."""
    spans = list(spans)
    return sum(high - low for low, high in intervals
               if any(begin <= low and high <= finish for begin, finish in spans))  # fmt: skip
