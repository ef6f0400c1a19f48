"""Where a run's hours went, over all its attempts: ml-goodput-measurement's own calculator.

`GoodputCalculator` reads a job's entries through its `cloud_logger` (Cloud Logging, by
default); `RecordsLogger` answers the same two calls from the records kept beside the
checkpoints, so the library's definitions compute the numbers here: goodput is the
productive, preserved step time over the wall time from the first attempt's start to the
last one's end (or now), and badput is split into its categories. What no category
explains is `other` (a count the library gets wrong is redone here, see `account`).
"""

from __future__ import annotations

import logging
import tempfile
from datetime import datetime
from typing import Any

from . import store

MISSING = "the goodput account needs ml-goodput-measurement: pip install -e '.[goodput]'"
# Async data loading overlaps the steps: the library reports it and leaves it out of the sum.
OVERLAPPED = "data_loading_async"
SYNC_LOADING = "data_loading_sync"


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
            percent, _, _ = calculator.get_job_goodput(include_badput_breakdown=True)
            details = calculator.get_job_goodput_details()
        finally:
            root.removeFilter(_recounted)
    badput: dict[str, Any] = {}
    for kind, seconds in details["badput_time"].items():
        name = kind.name.lower()
        is_table = isinstance(seconds, dict)
        badput[name] = {k.lower(): v for k, v in seconds.items()} if is_table else seconds
    wall = float(details["total_elapsed_time"])
    productive = float(details["goodput_time"][goodput.GoodputType.TOTAL])
    # The library (0.2.3) counts the data loading of the third and every later attempt twice:
    # once as the load after a restart and again when that attempt's first step shows the
    # restart. A timeline records only the set-up's loading, synchronous, once an attempt.
    badput[SYNC_LOADING], badput[OVERLAPPED] = _set_up_loading(entries), 0.0
    explained = productive + sum(
        _seconds(v) for k, v in badput.items() if k not in (OVERLAPPED, "other")
    )
    badput["other"] = max(0.0, wall - explained)
    counted = explained + badput["other"]
    return {
        "wall_seconds": wall,
        "productive_seconds": productive,
        "goodput_percent": percent,
        "badput_seconds": badput,
        "accounted_seconds": counted,
        "max_productive_step": details["max_productive_step"],
        "disruptions": details["disruption_count"],
        "attempts": sum(1 for entry in entries if "job_start_time" in entry),
    }


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


LABELS = {
    "tpu_initialization": "TPU initialization",
    "training_prep": "Training preparation",
    "program_startup": "Program startup (compilation)",
    "data_loading_sync": "Data loading",
    "data_loading_async": "Data loading, overlapped (not counted)",
    "unproductive_checkpoint_save_time": "Checkpoint saves",
    "unproductive_checkpoint_restore_time": "Checkpoint restores",
    "wasted_progress_from_disruption": "Wasted progress (steps trained again)",
    "infrastructure_recovery_from_disruption": "Recovery from disruptions",
    "custom_badput_events": "Other work in the loop",
    "other": "Other (unexplained)",
}


def rows(result: dict[str, Any]) -> list[tuple[str, float]]:
    """(label, seconds) of every component, productive time first."""
    found = [("Productive (goodput)", result["productive_seconds"])]
    for name, value in result["badput_seconds"].items():
        if isinstance(value, dict):
            found += [(f"{LABELS.get(name, name)}: {k}", v) for k, v in value.items()]
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
