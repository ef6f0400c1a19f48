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
