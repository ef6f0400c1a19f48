"""What a run keeps beside its checkpoints for the attempts after it: `<checkpoint_dir>-records`.

- `goodput/<attempt>.<part>.jsonl`: each attempt's events, in ml-goodput-measurement's own
  entry shapes, written in parts (an object store has no append);
- `incidents.log`: one line per attempt: when it started, from which step, how it ended;
- `completed.json`: written by the attempt that finished the run;
- `goodput.json`: the account over every attempt (the `goodput` command, the end of a run).

Beside the checkpoint directory, not in it: torch_xla's CheckpointManager takes every entry
there for a checkpoint. Any fsspec URL works (gs:// through gcsfs), as for checkpoints.
"""

from __future__ import annotations

import json
import os
import posixpath
import secrets
import socket
import time
from datetime import datetime, timedelta, timezone
from typing import Any

SUFFIX = "-records"
EVENTS = "goodput"
INCIDENTS = "incidents.log"
COMPLETED = "completed.json"
ACCOUNT = "goodput.json"
# The library's times are UTC; spelled so for every Python the project supports (3.10 has no
# datetime.UTC).
UTC = timezone(timedelta(0))
# Until its attempt rewrites it, an incident line says what a missing end means.
NO_END = "no end recorded (killed, or its VM was lost)"


def records_location(checkpoint_dir: str) -> str:
    return checkpoint_dir.rstrip("/") + SUFFIX


def _fs(location: str) -> tuple[Any, str]:
    import fsspec

    return fsspec.core.url_to_fs(location)  # type: ignore[no-any-return]


def write_text(location: str, name: str, text: str) -> None:
    fs, root = _fs(location)
    path = posixpath.join(root, name)
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    with fs.open(path, "w") as handle:
        handle.write(text)


def read_text(location: str, name: str) -> str | None:
    fs, root = _fs(location)
    try:
        with fs.open(posixpath.join(root, name), "r") as handle:
            return str(handle.read())
    except FileNotFoundError:
        return None


def write_events(location: str, attempt: str, part: int, entries: list[dict[str, Any]]) -> None:
    text = "".join(json.dumps(entry) + "\n" for entry in entries)
    write_text(location, f"{EVENTS}/{attempt}.{part:05d}.jsonl", text)


def read_events(location: str, attempt: str = "*") -> list[dict[str, Any]]:
    """Every attempt's events (or one attempt's), oldest first."""
    fs, root = _fs(location)
    paths = sorted(fs.glob(posixpath.join(root, EVENTS, f"{attempt}.*.jsonl")))
    if not paths:
        return []
    contents = fs.cat(paths)  # one batch of reads (concurrent on gs://)
    entries = [json.loads(line) for path in paths for line in contents[path].splitlines()]
    return sorted(entries, key=entry_time)


def entry_time(entry: dict[str, Any]) -> float:
    """An entry's time: its `..._time` value, as the library reads it."""
    return float(next(value for key, value in entry.items() if key.endswith("_time")))


def completion(location: str) -> dict[str, Any] | None:
    text = read_text(location, COMPLETED)
    return None if text is None else dict(json.loads(text))


def write_completion(location: str, record: dict[str, Any]) -> None:
    write_text(location, COMPLETED, json.dumps(record, indent=2) + "\n")


def new_attempt(started: float) -> str:
    """A name for an attempt that sorts by its start: 20261125T100000Z-1a2b3c."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started)) + "-" + secrets.token_hex(3)


def incident_line(started: float, attempt: str, step: int, ending: str) -> str:
    """When the attempt started, from which step, on which host, and how it ended."""
    when = datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds")
    return f"{when} attempt {attempt} from step {step} on {socket.gethostname()}: {ending}"


def set_incident(location: str, attempt: str, line: str) -> None:
    """Write `line` as the attempt's line of the incident log: in place, or appended.

    A read and a rewrite: an object store cannot append, and one attempt runs at a time.
    """
    lines = (read_text(location, INCIDENTS) or "").splitlines()
    tag = f" attempt {attempt} "
    kept = [existing for existing in lines if tag not in existing]
    at = next((i for i, existing in enumerate(lines) if tag in existing), len(kept))
    kept.insert(at, line)
    write_text(location, INCIDENTS, "".join(item + "\n" for item in kept))


def host_rank() -> int | None:
    """This host's index in the job when its launcher says it without the XLA runtime:
    SkyPilot (SKYPILOT_NODE_RANK), GKE and XPK (TPU_WORKER_ID); None when nothing does."""
    for name in ("SKYPILOT_NODE_RANK", "TPU_WORKER_ID"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None
