"""Goodput records: Google's recorder gets what a run records, its calculator reads both alike."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from {{ cookiecutter.package_name }}.goodput import account, store
from {{ cookiecutter.package_name }}.goodput.timeline import Timeline, job_name

from training_helpers import cli


class CloudLoggingStandIn:
    """Where ml-goodput-measurement's recorder writes (Cloud Logging, in the cloud)."""

    def __init__(self, job: str) -> None:
        self.job_name = job
        self.entries: list[dict[str, Any]] = []

    def write_cloud_logging_entry(self, entry: dict[str, Any]) -> None:
        self.entries.append(entry)


def test_cloud_goodput_gives_googles_recorder_every_event_of_the_local_records(
    tmp_path: Path,
) -> None:
    """It hands GoodputRecorder the job, phase, step and evaluation events it keeps beside the
    checkpoints (the checkpoint times, which the recorder has no call for, stay local), and
    the library's calculator gives the same account from either."""
    from ml_goodput_measurement import goodput

    checkpoints = str(tmp_path / "checkpoints")
    cloud = CloudLoggingStandIn(job_name(checkpoints))
    recorder = goodput.GoodputRecorder(
        cloud.job_name, "goodput_test", logging_enabled=True, cloud_logger=cloud
    )
    clock = Timeline(checkpoints, "cloud", {"max_steps": 4, "max_epochs": 1}, cloud=recorder)
    clock.phase("tpu_init")
    clock.phase("training_prep")
    with clock.checkpoint("restore", 0, checkpoints):
        time.sleep(0.01)
    clock.loop_started(0, master=True)
    for step in range(1, 5):
        time.sleep(0.01)
        if step == 2:
            with clock.badput("eval"):
                time.sleep(0.01)
        clock.step(step)
    clock.loop_ended("completed")
    assert clock.finished("completed", 4)["attempt"] == clock.attempt

    kept = store.read_events(store.records_location(checkpoints))
    shared = [entry for entry in kept if "event_type" not in entry]
    assert len(shared) < len(kept)  # the restore stays local
    assert len(cloud.entries) == len(shared)
    for sent, local in zip(cloud.entries, shared, strict=True):
        assert sent.keys() == local.keys()
        assert sent == {k: pytest.approx(v, abs=1e-5) if isinstance(v, float) else v
                        for k, v in local.items()}  # fmt: skip
    # The recorder keeps microseconds (it takes datetimes): the same account to 1e-5 s.
    both = sorted([*cloud.entries, *(e for e in kept if "event_type" in e)], key=store.entry_time)
    from_cloud, from_local = account.account(both), account.account(kept)
    for key in ("productive_seconds", "wall_seconds", "accounted_seconds"):
        assert from_cloud[key] == pytest.approx(from_local[key], abs=1e-5)
    assert from_local["badput_seconds"]["custom_badput_events"]["eval"] > 0
    assert store.completion(store.records_location(checkpoints)) == {
        "step": 4, "max_steps": 4, "max_epochs": 1,
    }  # fmt: skip


def test_goodput_of_a_run_without_records_fails_in_one_line(tmp_path: Path) -> None:
    """It says in one line that there are no records where it looked."""
    done = cli("goodput", str(tmp_path / "checkpoints"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: no goodput records in {str(tmp_path / 'checkpoints-records')!r}: "
        "give a run or checkpoint directory"
    ]


def test_an_account_of_three_attempts_counts_each_attempts_data_loading_once(
    tmp_path: Path,
) -> None:
    """Preempted at step 4, killed after step 7, completed at 12: each attempt's set-up
    loading is counted once (the library alone counts the third attempt's twice), and the
    components add up to the wall time."""
    checkpoints = str(tmp_path / "checkpoints")
    loading = (0.05, 0.1, 0.4)  # the last attempt's, long: counted twice, it would show

    def attempt(seconds: float, start: int, last: int, status: str | None) -> None:
        clock = Timeline(checkpoints, "local", {"max_steps": 12, "max_epochs": 0})
        time.sleep(seconds)
        clock.phase("tpu_init")
        clock.phase("training_prep")
        clock.loop_started(start, master=True)
        for step in range(start + 1, last + 1):
            time.sleep(0.02)
            clock.step(step)
        if status is None:  # the VM is gone: what was flushed before its save is all
            clock.flush()
            return
        clock.loop_ended(status)
        clock.finished(status, last)

    attempt(loading[0], 0, 4, "preempted")
    attempt(loading[1], 4, 7, None)
    attempt(loading[2], 4, 12, "completed")
    result = account.account(store.read_events(store.records_location(checkpoints)))
    assert (result["attempts"], result["disruptions"]) == (3, 2)
    badput, wall = result["badput_seconds"], result["wall_seconds"]
    assert sum(loading) <= badput["data_loading_sync"] < sum(loading) + 0.05
    assert abs(result["accounted_seconds"] - wall) <= 0.01 * wall
    assert badput["other"] <= 0.05 * wall
