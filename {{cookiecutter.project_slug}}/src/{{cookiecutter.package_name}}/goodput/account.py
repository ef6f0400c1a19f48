"""Where a run's hours went, over all its attempts: ml-goodput-measurement's own calculator.

`GoodputCalculator` reads a job's entries through its `cloud_logger` (Cloud Logging, by
default); `RecordsLogger` answers the same two calls from the records kept beside the
checkpoints, so the library's definitions compute the numbers here: goodput is the
productive, preserved step time over the wall time from the first attempt's start to the
last one's end (or now), and badput is split into its categories. Where the library misreads
these records its count is redone from them (`_recount`), and `other` is the time no
category claims (`intervals`), not what the others leave: the components add up to the wall
time only if no two of them count the same seconds.
"""

from __future__ import annotations

import logging
import tempfile
from datetime import datetime
from typing import Any

from . import intervals, store

MISSING = "the goodput account needs ml-goodput-measurement: pip install -e '.[goodput]'"
# Async data loading overlaps the steps: the library reports it and leaves it out of the sum.
OVERLAPPED = "data_loading_async"
SYNC_LOADING = "data_loading_sync"
SAVES = "unproductive_checkpoint_save_time"
RESTORES = "unproductive_checkpoint_restore_time"
RECOVERY = "infrastructure_recovery_from_disruption"


class RecordsLogger:
    """The calculator's logger, reading a run's records instead of Cloud Logging."""

    def __init__(self, job_name: str, entries: list[dict[str, Any]]) -> None:
        self.job_name = job_name
        self.entries = entries
        self.job_start_time: datetime | None = None

    def write_cloud_logging_entry(self, entry: dict[str, Any]) -> None:
        self.entries.append(entry)

    def read_cloud_logging_entries(
        self,
        start_time: datetime | None = None,
        end_time: datetime | None = None,
        last_entry_info: tuple[datetime, str] | None = None,
    ) -> tuple[list[dict[str, Any]], tuple[datetime | None, str | None]]:
        """Every entry the first time; nothing after the entry already read."""
        if last_entry_info is not None or not self.entries:
            return [], (None, None)
        last = datetime.fromtimestamp(store.entry_time(self.entries[-1]), store.UTC)
        return list(self.entries), (last, str(len(self.entries)))


def available() -> bool:
    try:
        import ml_goodput_measurement  # noqa: F401
    except ImportError:
        return False
    return True


def account(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The account of these entries (one attempt's, or every attempt's) in seconds."""
    from ml_goodput_measurement import goodput

    job = str(entries[0]["job_name"])
    with tempfile.TemporaryDirectory() as cache:  # the calculator keeps a timeline file there
        calculator = goodput.GoodputCalculator(
            job, f"goodput_{job}", cloud_logger=RecordsLogger(job, entries), cache_dir=cache
        )
        root = logging.getLogger()
        root.addFilter(_recounted)  # its warning about the count it gets wrong, redone below
        try:
            calculator.get_job_goodput(include_badput_breakdown=True)
            details = calculator.get_job_goodput_details()
        finally:
            root.removeFilter(_recounted)
    badput: dict[str, Any] = {}
    for kind, seconds in details["badput_time"].items():
        name = kind.name.lower()
        is_table = isinstance(seconds, dict)
        badput[name] = {k.lower(): v for k, v in seconds.items()} if is_table else seconds
    wall = float(details["total_elapsed_time"])
    reading = intervals.read(entries)
    productive = _recount(reading, float(details["goodput_time"][goodput.GoodputType.TOTAL]),
                          badput, entries)  # fmt: skip
    start = reading.starts[0] if reading.starts else 0.0
    badput["other"] = reading.unclaimed(start, start + wall)
    counted = productive + sum(_seconds(v) for k, v in badput.items() if k != OVERLAPPED)
    return {
        "wall_seconds": wall,
        "productive_seconds": productive,
        "goodput_percent": 100 * productive / wall,
        "badput_seconds": badput,
        "accounted_seconds": counted,
        "max_productive_step": details["max_productive_step"],
        "disruptions": details["disruption_count"],
        "attempts": len(reading.starts),
    }


def _recount(
    reading: intervals.Reading, productive: float, badput: dict[str, Any],
    entries: list[dict[str, Any]],
) -> float:  # fmt: skip
    """Redo, from the records, what the library (0.2.3) misreads in them; the productive time.

    - Data loading: it counts the loading of the third and every later attempt twice (once as
      the load after a restart, again when that attempt's first step shows the restart). A
      timeline records only the set-up's loading, synchronous, once an attempt.
    - The job's end: it takes the last step as running to the job's end, but a timeline's
      last mark ends the last step, so what follows (the final evaluation and save, the
      summary) is not productive: each of its parts is its own category, the rest `other`.
    - Checkpoints: it averages the saves (and restores) that share a step name, as if
      several hosts had written one; records before the timeline named each entry on its
      own have such pairs. Here every save and restore counts once.
    - Wasted progress: it counts evaluations and saves inside the steps trained again as
      wasted, and saves as saves too, subtracted from the productive time; and a restart
      from step 0 wastes nothing by its count. Here a wasted step is its training alone,
      and every evaluation counts as one, wherever it ran.
    - Recovery: a save recorded after a disrupted attempt's last mark (its step saved twice,
      the best weights first) counts as a save and as recovery; here as a save.
    """
    badput[SYNC_LOADING], badput[OVERLAPPED] = _set_up_loading(entries), 0.0
    wasted, recoveries = reading.wasted(), reading.recoveries()
    tail = reading.tail()
    if tail is not None:
        productive -= tail[1] - tail[0]
    # It took its count of every save out of the productive time: only the saves inside the
    # kept steps belong there; the others are outside them (wasted, recovery, the end).
    saves = sum(end - start for start, end in reading.saves)
    outside = wasted + recoveries + ([tail] if tail is not None else [])
    productive += badput.get(SAVES, 0.0) - saves + intervals.inside(reading.saves, outside)
    badput[SAVES] = saves
    badput[RESTORES] = sum(end - start for start, end in reading.restores)
    evaluations = {"eval": 0.0}
    for name, (start, end) in reading.events:
        evaluations[name] = evaluations.get(name, 0.0) + end - start
    badput["custom_badput_events"] = evaluations
    claimed = [*reading.saves, *(span for _, span in reading.events)]
    aside = intervals.inside(claimed, wasted)
    badput["wasted_progress_from_disruption"] = sum(end - start for start, end in wasted) - aside
    if RECOVERY in badput:
        badput[RECOVERY] -= intervals.inside(claimed, recoveries)
    return productive


def _recounted(record: logging.LogRecord) -> bool:
    return "DATA_LOADING" not in record.getMessage()


def _set_up_loading(entries: list[dict[str, Any]]) -> float:
    """The seconds between each data loading start and the end that follows it."""
    seconds, started = 0.0, None
    for entry in sorted(entries, key=store.entry_time):
        if "data_loading_start_time" in entry:
            started = float(entry["data_loading_start_time"])
        elif "data_loading_end_time" in entry and started is not None:
            seconds += float(entry["data_loading_end_time"]) - started
            started = None
    return seconds


def _seconds(value: Any) -> float:
    return float(sum(value.values())) if isinstance(value, dict) else float(value)


# The table's rows, in this order; any other category the library reports follows them.
LABELS = {
    "tpu_initialization": "TPU initialization",
    "training_prep": "Training preparation",
    "data_loading_sync": "Data loading",
    "unproductive_checkpoint_restore_time": "Checkpoint restores",
    "program_startup": "Program startup (compilation)",
    "custom_badput_events": "Other work in the loop",
    "unproductive_checkpoint_save_time": "Checkpoint saves",
    "wasted_progress_from_disruption": "Wasted progress (steps trained again)",
    "infrastructure_recovery_from_disruption": "Recovery from disruptions",
    "data_loading_async": "Data loading, overlapped (not counted)",
    "other": "Other (no category claims it)",
}
EVENT_LABELS = {"eval": "Evaluations", "rollouts": "Rollouts (GRPO: generation and rewards)"}


def rows(result: dict[str, Any]) -> list[tuple[str, float]]:
    """(label, seconds) of every component, productive time first, `other` last."""
    found = [("Productive (goodput)", result["productive_seconds"])]
    badput = result["badput_seconds"]
    order = [*(name for name in LABELS if name in badput), *(n for n in badput if n not in LABELS)]
    for name in sorted(order, key=lambda name: name == "other"):
        value = badput[name]
        if isinstance(value, dict):
            label = LABELS.get(name, name)
            found += [(EVENT_LABELS.get(k, f"{label}: {k}"), v) for k, v in value.items()]
        elif name in LABELS or value:
            found.append((LABELS.get(name, name), float(value)))
    return found


def print_table(result: dict[str, Any], title: str) -> None:
    """The account as a table: each component's time and share of the wall time."""
    from rich.console import Console
    from rich.table import Table

    wall = result["wall_seconds"] or 1.0
    table = Table(title=title, title_justify="left")
    table.add_column("Component")
    table.add_column("Time", justify="right")
    table.add_column("Share", justify="right")
    for label, seconds in rows(result):
        table.add_row(label, _clock(seconds), f"{100 * seconds / wall:.1f}%")
    table.add_section()
    table.add_row("Wall time", _clock(result["wall_seconds"]), "100.0%")
    table.add_row("Components together", _clock(result["accounted_seconds"]),
                  f"{100 * result['accounted_seconds'] / wall:.1f}%")  # fmt: skip
    Console(soft_wrap=True).print(table)
    attempts = f"{result['attempts']} attempt(s), {result['disruptions']} disruption(s)"
    Console().print(f"goodput {result['goodput_percent']:.1f}% over {attempts}", highlight=False)


def _clock(seconds: float) -> str:
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}.{int(100 * (seconds - whole)):02d}"
