"""A spot run rehearsed: the SkyPilot task's command, run here as SkyPilot runs it on a host,
preempted twice and relaunched by SkyPilot's own rules, ends with an unbroken run's losses."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import fsspec
import pytest
import yaml

from {{ cookiecutter.package_name }}.cli_common import EXIT_PREEMPTED, EXIT_USAGE
from {{ cookiecutter.package_name }}.goodput import store

from gates import signal_taken
from gcs_emulator import ObjectGate
from training_helpers import cli, write_config

pytestmark = pytest.mark.slow  # four trainings and a goodput account: `make test-fast` skips it

PROJECT = Path(__file__).resolve().parents[1]
STEPS = 12
# What SkyPilot sets for the task's run on each host (sky/backends/task_codegen.py, and the
# managed-job ids of sky/jobs/controller.py), here for the one host of a single-host slice.
TASK_ID = "sky-managed-2026-11-25-10-00-00-000000_{{ cookiecutter.project_slug }}_1-0"
SKYPILOT_ENV = {
    "SKYPILOT_NODE_RANK": "0",
    "SKYPILOT_NUM_NODES": "1",
    "SKYPILOT_NODE_IPS": "127.0.0.1",
    "SKYPILOT_NUM_GPUS_PER_NODE": "0",
    "SKYPILOT_TASK_ID": TASK_ID,
    "SKYPILOT_TASK_IDS": TASK_ID,
    "SKYPILOT_MANAGED_JOB_ID": "1",
}
Attempt = Callable[[], tuple[int, bool]]  # the host's exit code; whether its slice is still up


def task_of(folder: Path, checkpoint_dir: str, *args: str, restarts: int = 3) -> dict[str, Any]:
    """The task `spot task` writes, its per-host command on XLA:CPU with this interpreter
    (as `make pod-rehearse` runs `train-pod`)."""
    out = folder / "task.yaml"
    done = cli(
        "spot", "task", "--out", str(out), "--checkpoint-dir", checkpoint_dir,
        "--max-restarts-on-errors", str(restarts), "--python", sys.executable,
        "--accelerator", "cpu", "--devices", "1", "--", "--resume", "auto", *args, cwd=PROJECT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(yaml.safe_load(out.read_text()))


def start_host(task: dict[str, Any], home: Path) -> subprocess.Popen[str]:
    """Start the task's run on a new host, as SkyPilot does: the mounted files under
    ~/sky_workdir (relative mounts land there), `run` through bash from there, its env."""
    workdir = home / "sky_workdir"
    for remote, local in task["file_mounts"].items():
        source, target = PROJECT / local, workdir / remote
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"HOME": str(home), "PYTHONUNBUFFERED": "1", **SKYPILOT_ENV})
    return subprocess.Popen(
        ["bash", "-c", task["run"]], cwd=workdir, env={**env, **task.get("envs", {})},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def managed_job(task: dict[str, Any], attempts: Iterable[Attempt]) -> tuple[str, int]:
    """SkyPilot's decision after each attempt (sky/jobs/controller.py and
    recovery_strategy.py, 0.14.1): SUCCEEDED when the hosts exit 0; relaunched, uncounted,
    when the slice is gone or the exit code is in recover_on_exit_codes; otherwise an error,
    relaunched while the errors so far are at most max_restarts_on_errors, else FAILED."""
    recovery = task["resources"]["job_recovery"]
    errors, number = 0, 0
    for number, attempt in enumerate(attempts, 1):
        code, slice_up = attempt()
        if code == 0:
            return "SUCCEEDED", number
        if not slice_up or code in recovery["recover_on_exit_codes"]:
            continue
        errors += 1
        if errors > recovery["max_restarts_on_errors"]:
            return "FAILED", number
    return "RUNNING", number


@pytest.mark.interrupts
def test_spot_run_survives_two_preemptions_and_ends_as_an_unbroken_run(
    gated_gcs_bucket: tuple[str, ObjectGate], tmp_path: Path
) -> None:
    """It stops at a SIGTERM (exit 75, relaunched uncounted), loses its VM during a save
    (retrains from the checkpoint before), finishes with an unbroken run's losses, exits 0 at
    once when relaunched after that, logs one incident line per attempt and counts as many
    in its goodput account, whose measured components add up to the wall time with under 2%
    claimed by none, the retrained steps as wasted progress."""
    bucket, gate = gated_gcs_bucket
    checkpoints = f"{bucket}/runs/spot"
    prefix = checkpoints.removeprefix("gs://").split("/", 1)[1]
    # Synchronous saves: a held upload holds the loop, at a step the test knows.
    config = write_config(tmp_path, max_steps=STEPS, log_every=1, seed=9, checkpoint_every=4,
                          eval_every=6, async_checkpoint=False, goodput="local")  # fmt: skip
    reference = cli("train", "--config", str(config), "--run-dir", str(tmp_path / "unbroken"))
    assert reference.returncode == 0, reference.stderr[-3000:]
    task = task_of(tmp_path, checkpoints, "--config", str(config))
    outputs: list[str] = []

    def sigterm_while_saving_step_4() -> tuple[int, bool]:
        """SIGTERM while it saves step 4 (a maintenance event): the slice stays up."""
        gate.hold(f"{prefix}/4/")
        host = start_host(task, tmp_path / "vm-1")
        gate.held(host)  # it is at step 4 of 12, writing: mid-run for certain
        signal_taken(host, signal.SIGTERM)  # before the save ends and the loop looks
        gate.release()
        outputs.append(host.communicate(timeout=600)[0])
        return host.returncode, True

    def reclaimed_while_saving_step_8() -> tuple[int, bool]:
        """A fresh VM; SIGTERM during its save of step 8, then the VM is gone before the save
        ends (the 30 s notice ran out)."""
        gate.hold(f"{prefix}/8/")
        host = start_host(task, tmp_path / "vm-2")
        gate.held(host)
        signal_taken(host, signal.SIGTERM)
        host.kill()
        outputs.append(host.communicate(timeout=60)[0])
        gate.release(drop=True)  # the VM is gone: its upload never completes
        return host.returncode, False

    def runs_to_the_end() -> tuple[int, bool]:
        host = start_host(task, tmp_path / "vm-3")
        outputs.append(host.communicate(timeout=600)[0])
        return host.returncode, True

    attempts = [sigterm_while_saving_step_4, reclaimed_while_saving_step_8, runs_to_the_end]
    assert managed_job(task, attempts) == ("SUCCEEDED", 3), outputs
    first, second, third = outputs
    assert first.strip().splitlines()[-1].startswith("stopped by SIGTERM at step 4, saved to ")
    assert "resuming at step 4" in second
    assert "resuming at step 4 " in third  # step 8 never became whole
    finished = tmp_path / "vm-3/sky_workdir/{{ cookiecutter.project_slug }}/runs/default/summary.json"
    summary = json.loads(finished.read_text())
    unbroken = json.loads((tmp_path / "unbroken" / "summary.json").read_text())
    assert summary["train_losses"] == unbroken["train_losses"]
    assert summary["goodput"]["attempts"] == 1  # this attempt's own share

    relaunch = start_host(task, tmp_path / "vm-4")
    said = relaunch.communicate(timeout=300)[0]
    assert relaunch.returncode == 0, said
    assert "already complete" in said and " train loss=" not in said
    assert not list((tmp_path / "vm-4").rglob("summary.json"))

    records = store.records_location(checkpoints)
    incidents = store.read_text(records, store.INCIDENTS)
    assert incidents is not None
    lines = incidents.splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == [
        f"preempted at step 4, saved (exit {EXIT_PREEMPTED})",
        store.NO_END,
        f"completed at step {STEPS} (exit 0)",
        "already complete, nothing trained (exit 0)",
    ]
    assert [line.split(" from step ")[1].split()[0] for line in lines] == ["0", "4", "4", "12"]

    account = cli("goodput", checkpoints)
    assert account.returncode == 0, account.stderr
    assert "Wasted progress (steps trained again)" in account.stdout
    fs = fsspec.filesystem("gs")
    result = json.loads(fs.cat(f"{records}/{store.ACCOUNT}"))
    badput, wall = result["badput_seconds"], result["wall_seconds"]
    assert (result["attempts"], result["disruptions"]) == (len(lines), 2) == (4, 2)
    measured = [
        "tpu_initialization", "training_prep", "data_loading_sync", "program_startup",
        "unproductive_checkpoint_save_time", "unproductive_checkpoint_restore_time",
        "wasted_progress_from_disruption", "infrastructure_recovery_from_disruption",
    ]  # fmt: skip
    assert all(badput[name] > 0 for name in measured), badput
    assert badput["custom_badput_events"]["eval"] > 0 and result["productive_seconds"] > 0
    assert result["accounted_seconds"] == pytest.approx(wall, rel=1e-9)
    assert 0 <= badput["other"] < 0.02 * wall
    # Wasted: the steps the reclaimed attempt trained past step 4, from its own step marks,
    # but for the evaluation at step 6 and the save of its best weights, counted as such.
    attempt = lines[1].split(" attempt ")[1].split()[0]
    kept = store.read_events(records, attempt)
    marks = {e["step_count"]: e["step_start_time"] for e in kept if "step_count" in e}
    assert sorted(marks) == [4, 5, 6, 7]
    saved = [e["checkpoint_manager_blocking_duration_secs"] for e in kept
             if e.get("event_type") == "save"]  # fmt: skip
    times = [store.entry_time(e) for e in kept if "custom_badput_event_type" in e]
    assert len(saved) == 1 and len(times) == 2  # the best weights' save; one evaluation
    aside = saved[0] + times[1] - times[0]
    assert badput["wasted_progress_from_disruption"] == pytest.approx(marks[7] - marks[4] - aside)


def test_training_error_is_relaunched_only_max_restarts_on_errors_times(tmp_path: Path) -> None:
    """It exits 2 on a bad config, a code SkyPilot counts: relaunched once, then FAILED."""
    config = write_config(tmp_path, max_steps=2)
    task = task_of(tmp_path, "gs://bucket/runs/broken", "--config", str(config), "--set",
                   "lr=-1", restarts=1)  # fmt: skip
    codes: list[int] = []

    def fails() -> tuple[int, bool]:
        host = start_host(task, tmp_path / f"vm-{len(codes)}")
        output = host.communicate(timeout=300)[0]
        assert "error: lr must be positive" in output, output
        codes.append(host.returncode)
        return host.returncode, True

    assert managed_job(task, [fails] * 5) == ("FAILED", 2)
    assert codes == [EXIT_USAGE, EXIT_USAGE]
