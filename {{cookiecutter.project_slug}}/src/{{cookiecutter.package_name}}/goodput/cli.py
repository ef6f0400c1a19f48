"""The `goodput` command, and the account the end of every `train` prints and saves."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ..cli_common import fail
from . import account, store
from .timeline import job_name

LOCATION_HELP = (
    "A run directory (its summary.json names the records), a checkpoint directory, or its "
    "-records folder; a path or gs:// URL."
)


def records_of(location: str) -> str:
    """The records folder a location names."""
    location = location.rstrip("/")
    summary = Path(location) / "summary.json"
    if "://" not in location and summary.is_file():
        named = json.loads(summary.read_text()).get("records", {}).get("location")
        if not named:
            fail(f'{str(summary)!r} names no records: the run kept none (goodput = "off"?)')
        return str(named)
    return location if location.endswith(store.SUFFIX) else store.records_location(location)


def goodput_command(
    location: Annotated[str, typer.Argument(help=LOCATION_HELP, show_default=False)],
) -> None:
    """Sum every attempt of a run into goodput.json beside its records and print the table."""
    if not account.available():
        fail(account.MISSING)
    records = records_of(location)
    try:
        entries = store.read_events(records)
    except OSError as error:
        fail(f"cannot read {records!r}: {error}")
    if not entries:
        fail(f"no goodput records in {records!r}: give a run or checkpoint directory")
    try:
        result = account.account(entries)
    except ValueError as error:  # the library's own checks of the entries
        fail(f"no goodput account of {records!r}: {str(error).strip()[:200]}")
    store.write_text(records, store.ACCOUNT, json.dumps(result, indent=2) + "\n")
    account.print_table(result, f"Goodput of {records}")
    typer.echo(f"written: {records}/{store.ACCOUNT}")


def end_of_run(summary: dict[str, Any]) -> None:
    """After a run: the account of every attempt so far (goodput.json beside the records, and
    the table), and this attempt's own in its summary.json."""
    records = summary.get("records") or {}
    if not records:
        return  # not the run's master, or goodput = "off"
    if not account.available():
        typer.echo(f"note: no goodput account: {account.MISSING}")
        return
    location, attempt = records["location"], records["attempt"]
    try:  # the run is done whatever happens here: an account that fails is a note
        whole = account.account(store.read_events(location))
        store.write_text(location, store.ACCOUNT, json.dumps(whole, indent=2) + "\n")
        own = account.account(store.read_events(location, attempt))
    except Exception as error:  # reading gs://, or the library's own checks (ValueError)
        typer.echo(f"note: no goodput account: {str(error).strip()[:200]}")
        return
    account.print_table(whole, f"Goodput of the run so far ({location})")
    path = Path(summary["run_dir"]) / "summary.json"
    if path.is_file():
        saved = json.loads(path.read_text())
        saved["goodput"] = own
        path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")


def finished_before(config: Any) -> bool:
    """True when a relaunch (`--resume auto` or `latest`) finds its run completed, at the
    length it asks for: one line says so, the incident log gets the attempt, nothing trains."""
    from ..training.checkpoint import default_directory

    if config.resume not in ("auto", "latest") or config.goodput == "off":
        return False
    directory = default_directory(config.run_dir, config.checkpoint_dir)
    location = store.records_location(directory)
    try:
        record = store.completion(location)
    except (OSError, ValueError, ImportError):
        return False  # unreadable: training says why, in its own words
    asked = {"max_steps": config.max_steps, "max_epochs": config.max_epochs}
    if record is None or {key: record.get(key) for key in asked} != asked:
        return False
    step = int(record["step"])
    typer.echo(f"already complete: {directory} holds the run's last step, {step}; nothing to train")
    if store.host_rank() in (0, None):  # one line per attempt, from the first host
        started = time.time()
        attempt = store.new_attempt(started)
        ending = "already complete, nothing trained (exit 0)"
        # An attempt of the account as of the incident log: its start, and no end, so the
        # run's wall time still ends where it completed (a relaunch days later would
        # otherwise stretch it over the idle days).
        start = {"job_name": job_name(directory), "job_start_time": started}
        line = store.incident_line(started, attempt, step, ending)
        try:
            store.write_events(location, attempt, 0, [start])
            store.set_incident(location, attempt, line)
        except Exception as error:  # fsspec and gcsfs raise many types: said, not raised
            typer.echo(f"note: the relaunch is not on record ({str(error).strip()[:200]})")
    return True
