"""One attempt's timeline in Google's goodput categories, kept beside the run's checkpoints.

The loop calls one `Timeline` at its phase boundaries: the attempt's start, data loading,
TPU initialization, training preparation, checkpoint restores and saves, every step's
start, evaluations, and its end. Entries have ml-goodput-measurement's own shapes and
names, so its calculator reads them (`account.py`). A step mark is a clock reading and a
list append: no device read, no host sync. Entries go to the store at the loop's start,
before every save (so the steps a save keeps are on record even if the VM dies during
it), after it (its step's mark, taken as it ends: a relaunch from that checkpoint records
the step again, the restart the library looks for, however soon the VM dies after the
save), every FLUSH_SECONDS, and at the end. Only the run's master process writes.

How the library's definitions read this timeline:
- a step's time runs from its start mark to the next one's; the first step's excess over
  the others is program startup (compilation);
- a step number seen again is a restart: the steps after it in the earlier attempt are
  wasted progress, and the time from that attempt's last mark to the next attempt's start
  is infrastructure recovery. A preempted attempt marks the step it stopped at before
  saving, so the save at the stop belongs to the recovery (it is not recorded as a save);
- the library takes the last step of a finished job as running to the job's end; here the
  last mark ends the last step, and the account gives the time after it to the final
  evaluation and save it holds, and the rest to `other` (`account._recount`).
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from ..exit_codes import EXIT_OF_STATUS
from . import store

FLUSH_SECONDS = 300.0
PHASES = ("data_loading", "tpu_init", "training_prep")
# Saves of the same step by several hosts are averaged by the library's checkpoint
# calculator; here one host writes, and two saves of a step (the best weights and the step's,
# or its save and the wait for its background write) or the same step restored by two
# attempts are two entries, so each entry's step names its attempt and its place in it.
_SAVE = {
    "checkpoint_manager_blocking_duration_secs": 0.0,
    "checkpointer_blocking_duration_secs": 0.0,
    "wait_for_prev_duration_secs": 0.0,
    "get_old_steps_duration_secs": 0.0,
}
_RESTORE = {"checkpoint_manager_duration_secs": 0.0, "checkpointer_duration_secs": 0.0}
_writing: Timeline | None = None  # the timeline this process writes: a failure's line goes there


def job_name(checkpoint_dir: str) -> str:
    """The job's name in the library's entries: its checkpoint directory, as one word."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", checkpoint_dir.split("://")[-1]).strip("-")


class Timeline:
    """The timeline of one attempt; inert with `mode="off"`, and in processes that are not the
    run's master. With `mode="cloud"` ml-goodput-measurement's GoodputRecorder (`cloud`, or
    one writing to Cloud Logging) gets every entry too."""

    def __init__(
        self, checkpoint_dir: str, mode: str = "local", length: dict[str, int] | None = None,
        cloud: Any = None,
    ) -> None:  # fmt: skip
        self.location = store.records_location(checkpoint_dir)
        self.job = job_name(checkpoint_dir)
        self.enabled = mode != "off"
        self.mode = mode
        self.length = length or {}
        self.cloud = cloud
        self.started = time.time()
        self.attempt = store.new_attempt(self.started)
        self.pending: list[dict[str, Any]] = []
        self.marks: list[tuple[int, float]] = []
        self.marked: int | None = None  # the step of the last mark
        self.part = 0
        self.checkpoints = 0  # saves and restores recorded
        self.flushed_at = self.started
        self.writer = False
        self.stopping = False
        self.from_step = 0
        self.open: str | None = None
        self.warned = False
        self._entry({"job_start_time": self.started})
        self.phase("data_loading")

    @classmethod
    def of_run(cls, config: Any, checkpoint_dir: str) -> Timeline:
        length = {"max_steps": config.max_steps, "max_epochs": config.max_epochs}
        return cls(checkpoint_dir, config.goodput, length)

    def _entry(self, entry: dict[str, Any]) -> None:
        if self.enabled:
            self.pending.append({"job_name": self.job, **entry})

    def phase(self, name: str | None) -> None:
        """End the open set-up phase and start `name` (data_loading, tpu_init, training_prep)."""
        now = time.time()
        if self.open is not None:
            self._entry({f"{self.open}_end_time": now})
        self.open = name
        if name is not None:
            self._entry({f"{name}_start_time": now})

    def loop_started(self, step: int, master: bool) -> None:
        """Set-up is over: the first step starts. The master process writes from here on."""
        self.phase(None)
        self.writer = self.enabled and master
        if not self.writer:
            self.pending = []
            return
        global _writing
        _writing = self
        if self.mode == "cloud" and self.cloud is None:
            self.cloud = cloud_recorder(self.job)  # the master's, to Cloud Logging
        self.from_step = step
        self._mark(step, time.time())
        self._incident(store.NO_END)
        self.flush()

    def step(self, step: int) -> None:
        """Step `step` is done: the next one starts now."""
        if step == self.marked:
            return  # marked as its save ended
        now = time.time()
        self._mark(step, now)
        if self.writer and now - self.flushed_at > FLUSH_SECONDS:
            self.flush()

    def _mark(self, step: int, at: float) -> None:
        self.marks.append((step, at))
        self.marked = step

    @contextlib.contextmanager
    def checkpoint(self, kind: str, step: int, directory: str) -> Iterator[None]:
        """Time a checkpoint `save` or `restore` (a restore pauses the open set-up phase)."""
        paused = self.open
        self.phase(None)
        started = time.time()
        if kind == "save":
            self.flush()  # the steps it keeps are on record first: part of the save's time
        yield
        seconds = time.time() - started
        if not (kind == "save" and self.stopping):
            times = dict.fromkeys(_SAVE if kind == "save" else _RESTORE, seconds)
            if kind == "save":
                times["wait_for_prev_duration_secs"] = times["get_old_steps_duration_secs"] = 0.0
            self.checkpoints += 1
            step_of_attempt = f"{step}@{self.attempt}#{self.checkpoints}"
            self._entry({"event_type": kind, "step": step_of_attempt, "directory": directory,
                         "checkpoint_start_time": started, **times})  # fmt: skip
            if kind == "save" and self.writer and self.marked == step - 1:
                self._mark(step, started + seconds)  # the step is done and saved
                self.flush()
        self.phase(paused)

    @contextlib.contextmanager
    def badput(self, name: str) -> Iterator[None]:
        """Time work inside the loop that is not training (an evaluation): a custom event."""
        kind = {"custom_badput_event_type": name}
        self._entry({**kind, "custom_badput_event_start_time": time.time()})
        yield
        self._entry({**kind, "custom_badput_event_end_time": time.time()})

    def loop_ended(self, status: str) -> None:
        """The loop stopped; a run that did not complete is disrupted from here on."""
        if status != "completed":
            self.stopping = True
            self.flush()

    def finished(self, status: str, step: int) -> dict[str, str]:
        """The attempt's end: the job's end and the completion record if it completed, the
        incident line; what the summary names of the records."""
        if not self.writer:
            return {}
        if status == "completed":
            self._entry({"job_end_time": time.time()})
            record = {"step": step, **self.length}
            self._write("completion record", lambda: store.write_completion(self.location, record))
        self.flush()
        code = EXIT_OF_STATUS[status]
        endings = {
            "completed": f"completed at step {step}",
            "preempted": f"preempted at step {step}, saved",
            "diverged": f"diverged at step {step}",
        }
        self._incident(f"{endings[status]} (exit {code})")
        return {"location": self.location, "attempt": self.attempt}

    def failed(self, message: str, code: int) -> None:
        if self.writer:
            self.flush()
            self._incident(f"failed (exit {code}): {message}")

    def flush(self) -> None:
        """Write the entries since the last flush as one more part of the attempt's events."""
        if not self.writer:
            return
        steps = [{"job_name": self.job, "step_count": s, "step_start_time": at}
                 for s, at in self.marks]  # fmt: skip
        entries = sorted(self.pending + steps, key=store.entry_time)
        self.pending, self.marks, self.flushed_at = [], [], time.time()
        if entries:
            part, self.part = self.part, self.part + 1
            where = (self.location, self.attempt, part)
            self._write("records", lambda: store.write_events(*where, entries))
            if self.cloud is not None:
                send_to_cloud(self.cloud, entries)

    def _incident(self, ending: str) -> None:
        line = store.incident_line(self.started, self.attempt, self.from_step, ending)
        self._write("incident line", lambda: store.set_incident(self.location, self.attempt, line))

    def _write(self, what: str, write: Callable[[], None]) -> None:
        """Records are worth less than the run: a write that fails is said once, not raised."""
        try:
            write()
        except Exception as error:  # fsspec and gcsfs raise many types
            if not self.warned:
                reason = (str(error).strip() or type(error).__name__).splitlines()[0][:200]
                print(f"goodput: {what} not written ({reason}); training goes on", file=sys.stderr)
                self.warned = True


def record_failure(message: str, code: int) -> None:
    """Give the attempt this process writes (if any) its failure as its incident line."""
    if _writing is not None:
        _writing.failed(message, code)


# The library's recorder method for each entry that starts with this key; checkpoint
# entries have none (orbax logs them in JAX): they stay in the local records only.
_RECORDERS = {
    "job_start_time": "record_job_start_time",
    "job_end_time": "record_job_end_time",
    "tpu_init_start_time": "record_tpu_init_start_time",
    "tpu_init_end_time": "record_tpu_init_end_time",
    "training_prep_start_time": "record_training_preparation_start_time",
    "training_prep_end_time": "record_training_preparation_end_time",
    "data_loading_start_time": "record_data_loading_start_time",
    "data_loading_end_time": "record_data_loading_end_time",
}


def cloud_recorder(job: str) -> Any:
    """ml-goodput-measurement's recorder writing to Cloud Logging (the `goodput` extra)."""
    from ml_goodput_measurement import goodput

    return goodput.GoodputRecorder(job, f"goodput_{job}", logging_enabled=True)


def send_to_cloud(recorder: Any, entries: list[dict[str, Any]]) -> None:
    """Give the library's recorder each entry, at its own time (its writes are asynchronous)."""
    for entry in entries:
        at = datetime.fromtimestamp(store.entry_time(entry), store.UTC)
        if "step_count" in entry:
            recorder.record_step_start_time(entry["step_count"], at)
        elif "custom_badput_event_type" in entry:
            kind = entry["custom_badput_event_type"]
            if "custom_badput_event_start_time" in entry:
                recorder.record_custom_badput_event_start_time(at, kind)
            else:
                recorder.record_custom_badput_event_end_time(at, kind)
        else:
            method = next((_RECORDERS[k] for k in entry if k in _RECORDERS), None)
            if method is not None:
                getattr(recorder, method)(at)
