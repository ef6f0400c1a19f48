"""Goodput: Google's recorder gets what a run records, and the account gives every second of
the wall time to the category that measured it, `other` to what none did."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from {{ cookiecutter.package_name }}.goodput import account, store
from {{ cookiecutter.package_name }}.goodput.timeline import Timeline, job_name

from training_helpers import cli, write_config

T = 1_800_000_000.0  # the records' clock: any time will do
# A checkpoint entry's durations, as a timeline writes them (the first two: the whole time).
SAVE_TIMES = (
    "checkpoint_manager_blocking_duration_secs", "checkpointer_blocking_duration_secs",
    "wait_for_prev_duration_secs", "get_old_steps_duration_secs",
)  # fmt: skip
RESTORE_TIMES = ("checkpoint_manager_duration_secs", "checkpointer_duration_secs")


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


def test_a_step_saved_just_before_its_vm_was_lost_is_a_restart_when_resumed(
    tmp_path: Path,
) -> None:
    """It has the saved step on record as its save ends, so the attempt resumed from it is a
    restart (one disruption), not a step that ran across the lost VM and the new set-up."""
    checkpoints = str(tmp_path / "checkpoints")
    length = {"max_steps": 4, "max_epochs": 0}
    lost = Timeline(checkpoints, "local", length)
    lost.phase("tpu_init")
    lost.loop_started(0, master=True)
    lost.step(1)
    with lost.checkpoint("save", 2, checkpoints):  # step 2 trained, then saved
        pass
    resumed = Timeline(checkpoints, "local", length)  # nothing more of `lost` was written
    resumed.phase("tpu_init")
    with resumed.checkpoint("restore", 2, checkpoints):
        pass
    resumed.loop_started(2, master=True)
    resumed.step(3)
    resumed.step(4)
    resumed.loop_ended("completed")
    resumed.finished("completed", 4)
    result = account.account(store.read_events(store.records_location(checkpoints)))
    assert (result["attempts"], result["disruptions"]) == (2, 1)
    assert result["accounted_seconds"] == pytest.approx(result["wall_seconds"], rel=1e-9)


def test_goodput_of_a_run_without_records_fails_in_one_line(tmp_path: Path) -> None:
    """It says in one line that there are no records where it looked."""
    done = cli("goodput", str(tmp_path / "checkpoints"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: no goodput records in {str(tmp_path / 'checkpoints-records')!r}: "
        "give a run or checkpoint directory"
    ]


# ---- accounts of records written here, at known times --------------------------------------


def attempt(
    start: float, set_up: tuple[float, float, float], restore: float = 0.0,
    marks: list[tuple[int, float]] | None = None, saves: tuple[tuple[float, float], ...] = (),
    evaluations: tuple[tuple[float, float], ...] = (), end: float | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """One attempt's records in a timeline's shapes, at T + the given seconds: its start, data
    loading, TPU init and training preparation back to back for `set_up` seconds, a restore
    after them, a mark per (step, time), saves and evaluations (start, end), its end."""
    at, found = T + start, [{"job_start_time": T + start}]
    for phase, seconds in zip(("data_loading", "tpu_init", "training_prep"), set_up, strict=True):
        found += [{f"{phase}_start_time": at}, {f"{phase}_end_time": at + seconds}]
        at += seconds
    checkpoints = [("restore", at, at + restore)] if restore else []
    checkpoints += [("save", T + begun, T + ended) for begun, ended in saves]
    for number, (kind, begun, ended) in enumerate(checkpoints):
        names = RESTORE_TIMES if kind == "restore" else SAVE_TIMES
        times = {name: ended - begun if name in names[:2] else 0.0 for name in names}
        found.append({"event_type": kind, "step": f"{start}#{number}", "directory": "/ckpt",
                      "checkpoint_start_time": begun, **times})  # fmt: skip
    found += [{"step_count": step, "step_start_time": T + when} for step, when in marks or []]
    kind = {"custom_badput_event_type": "eval"}
    for begun, ended in evaluations:
        found += [{**kind, "custom_badput_event_start_time": T + begun},
                  {**kind, "custom_badput_event_end_time": T + ended}]  # fmt: skip
    if end is not None:
        found.append({"job_end_time": T + end})
    return [{"job_name": "job", **entry} for entry in found]


def one_completed_attempt(prep: tuple[float, float] = (2.0, 3.0)) -> list[dict[str, Any]]:
    """Set-up for 3 s, a first step of 5 s (compiling), nine of 1 s, then after the last
    step: 0.5 s, the final evaluation (10 s), 0.5 s, the final save (2 s), 0.5 s, the end."""
    marks = [(0, 3.0), (1, 8.0)] + [(k, 7.0 + k) for k in range(2, 11)]
    entries = attempt(0.0, (1.0, 1.0, 1.0), marks=marks, saves=((28.0, 30.0),),
                      evaluations=((17.5, 27.5),), end=30.5)  # fmt: skip
    for entry in entries:  # the preparation's interval, as given
        if "training_prep_start_time" in entry:
            entry["training_prep_start_time"] = T + prep[0]
        if "training_prep_end_time" in entry:
            entry["training_prep_end_time"] = T + prep[1]
    return entries


def test_the_final_evaluation_is_evaluation_badput_not_productive_time() -> None:
    """It counts the evaluation after the last step as an evaluation: the productive time is
    the ten steps' less the first one's compilation."""
    result = account.account(one_completed_attempt())
    assert result["badput_seconds"]["custom_badput_events"]["eval"] == pytest.approx(10.0)
    assert result["productive_seconds"] == pytest.approx(10.0)
    assert result["badput_seconds"]["program_startup"] == pytest.approx(4.0)
    assert result["goodput_percent"] == pytest.approx(100 * 10.0 / 30.5)


def test_other_is_the_time_between_records_that_no_category_claims() -> None:
    """It gives `other` the three half seconds no record covers, and the components measured
    add up to the wall time with it."""
    result = account.account(one_completed_attempt())
    assert result["badput_seconds"]["other"] == pytest.approx(1.5)
    assert result["accounted_seconds"] == pytest.approx(result["wall_seconds"]) == 30.5


def test_the_components_exceed_the_wall_time_when_two_categories_claim_the_same_seconds() -> None:
    """It shows an overlap in the sum: training preparation recorded from 1.5 s while TPU
    initialization ran to 2 s makes the components half a second more than the wall time."""
    result = account.account(one_completed_attempt(prep=(1.5, 3.0)))
    assert result["accounted_seconds"] == pytest.approx(result["wall_seconds"] + 0.5)


@pytest.fixture(scope="module")
def four_attempts() -> dict[str, Any]:
    """Preempted after step 4 (saved twice: the best weights, then the step); killed after
    step 7 (an evaluation and a save in step 6); resumed from step 4 to the end (12),
    evaluated and saved after it; relaunched after that. Data loading takes 0.05, 0.1 and
    0.4 s."""
    first_marks = [(0, 2.05), (1, 7.05), (2, 8.05), (3, 9.05), (4, 10.05)]
    preempted = attempt(0.0, (0.05, 1.0, 1.0), marks=first_marks, saves=((10.1, 10.6),))
    second_marks = [(4, 22.6), (5, 27.6), (6, 28.6), (7, 29.6)]
    killed = attempt(20.0, (0.1, 1.0, 1.0), restore=0.5, marks=second_marks,
                     saves=((28.1, 28.3),), evaluations=((27.8, 28.0),))  # fmt: skip
    last_marks = [(4, 42.9), (5, 47.9)] + [(k, 42.9 + k) for k in range(6, 13)]
    completed = attempt(40.0, (0.4, 1.0, 1.0), restore=0.5, marks=last_marks,
                        saves=((57.5, 58.5),), evaluations=((55.4, 57.4),), end=59.0)  # fmt: skip
    relaunched = {"job_name": "job", "job_start_time": T + 70.0}  # "already complete"
    entries = [*preempted, *killed, *completed, relaunched]
    return account.account(entries)


def test_an_account_of_three_attempts_counts_each_attempts_data_loading_once(
    four_attempts: dict[str, Any],
) -> None:
    """It counts each attempt's set-up loading once (the library alone counts the third
    attempt's twice)."""
    assert four_attempts["badput_seconds"]["data_loading_sync"] == pytest.approx(0.55)


def test_evaluations_and_saves_in_steps_trained_again_keep_their_categories(
    four_attempts: dict[str, Any],
) -> None:
    """It counts the steps trained again as wasted progress without the evaluation and the
    save inside them, which count as an evaluation and a save, once."""
    badput = four_attempts["badput_seconds"]
    assert badput["wasted_progress_from_disruption"] == pytest.approx(7.0 - 0.2 - 0.2)
    assert badput["custom_badput_events"]["eval"] == pytest.approx(0.2 + 2.0)
    assert badput["unproductive_checkpoint_save_time"] == pytest.approx(0.5 + 0.2 + 1.0)
    assert four_attempts["productive_seconds"] == pytest.approx(4.0 + 8.0)


def test_a_relaunch_after_completion_is_an_attempt_outside_the_wall_time(
    four_attempts: dict[str, Any],
) -> None:
    """It counts the relaunch that found the run complete as an attempt, and the wall time
    ends where the run completed."""
    assert (four_attempts["attempts"], four_attempts["disruptions"]) == (4, 2)
    assert four_attempts["wall_seconds"] == pytest.approx(59.0)


def test_a_disrupted_runs_components_add_up_to_the_wall_time(
    four_attempts: dict[str, Any],
) -> None:
    """It gives recovery the time from each disrupted attempt's last step to the next start
    but for the save in it, `other` the gaps around the final evaluation and save, and the
    sum is the wall time."""
    badput = four_attempts["badput_seconds"]
    assert badput["infrastructure_recovery_from_disruption"] == pytest.approx(9.95 - 0.5 + 10.4)
    assert badput["other"] == pytest.approx(0.5 + 0.1 + 0.5)
    assert four_attempts["accounted_seconds"] == pytest.approx(four_attempts["wall_seconds"])


# ---- a run of the project's task ------------------------------------------------------------


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 30 steps whose only evaluation follows the last step, its goodput kept."""
    folder = tmp_path_factory.mktemp("clean")
    config = write_config(folder, max_steps=30, log_every=10, eval_every=0, goodput="local")
    done = cli("train", "--config", str(config), "--run-dir", str(folder / "run"))
    assert done.returncode == 0, done.stderr[-3000:]
    return folder / "run"


def records_of(run: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The run's records and the account its end wrote beside them."""
    records = store.records_location(str(run / "checkpoints"))
    result = json.loads(Path(records, store.ACCOUNT).read_text())
    return store.read_events(records), result


def test_a_runs_final_evaluation_is_not_productive_time(clean_run: Path) -> None:
    """It counts the evaluation recorded after the last step as evaluation, and no second
    after the last step as productive."""
    entries, result = records_of(clean_run)
    marks = [entry["step_start_time"] for entry in entries if "step_count" in entry]
    began = [e["custom_badput_event_start_time"] for e in entries
             if "custom_badput_event_start_time" in e]  # fmt: skip
    ended = [e["custom_badput_event_end_time"] for e in entries
             if "custom_badput_event_end_time" in e]  # fmt: skip
    assert len(began) == len(ended) == 1 and began[0] >= marks[-1]
    badput = result["badput_seconds"]
    assert badput["custom_badput_events"]["eval"] == pytest.approx(ended[0] - began[0])
    steps = marks[-1] - marks[0]
    assert result["productive_seconds"] + badput["program_startup"] <= steps + 1e-6


def test_a_clean_run_leaves_under_2_percent_of_its_wall_time_to_other(clean_run: Path) -> None:
    """It leaves `other` under 2% of a run's wall time (which starts at its first record),
    and the components measured add up to the wall time."""
    _, result = records_of(clean_run)
    wall = result["wall_seconds"]
    assert 0 <= result["badput_seconds"]["other"] < 0.02 * wall
    assert result["accounted_seconds"] == pytest.approx(wall, rel=1e-9)


def test_a_relaunch_of_a_completed_run_is_an_attempt_of_its_account(
    clean_run: Path, tmp_path: Path
) -> None:
    """It records the relaunch that finds the run complete: the account has as many attempts
    as the incident log has lines, and the same wall time."""
    run = tmp_path / "run"
    shutil.copytree(clean_run, run)
    config = tmp_path / "tiny.yaml"
    shutil.copy(clean_run.parent / "tiny.yaml", config)
    again = cli("train", "--config", str(config), "--run-dir", str(run), "--resume", "auto")
    assert again.returncode == 0 and "already complete" in again.stdout, again.stdout
    summed = cli("goodput", str(run / "checkpoints"))  # its summary names the first's records
    assert summed.returncode == 0, summed.stderr
    records = store.records_location(str(run / "checkpoints"))
    lines = (store.read_text(records, store.INCIDENTS) or "").splitlines()
    result = json.loads(Path(records, store.ACCOUNT).read_text())
    assert result["attempts"] == len(lines) == 2
    assert result["wall_seconds"] == records_of(clean_run)[1]["wall_seconds"]
