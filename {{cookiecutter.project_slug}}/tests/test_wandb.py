"""Weights & Biases beside TensorBoard: W&B's own files hold the run, one run across attempts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from {{ cookiecutter.package_name }}.cli_common import EXIT_PREEMPTED
from {{ cookiecutter.package_name }}.goodput import store
from {{ cookiecutter.package_name }}.training.loggers import RUN_ID, STEP

from gates import Gate
from training_helpers import cli, cli_env, preempt, write_config

STEPS = 12
WANDB = ("--set", "loggers=tensorboard,wandb")


def records_of(wandb_file: Path) -> list[dict[str, Any]]:
    """Every record of a run's .wandb transaction log, read by wandb's own reader."""
    result = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(wandb_file)],
        env={**os.environ, "WANDB_SILENT": "true"}, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def attempt(run_dir: Path) -> dict[str, Any]:
    """The one W&B run (an attempt) a run directory holds: its run record, history, summary
    (the last value of each key) and exit code."""
    (wandb_file,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    found: dict[str, Any] = {"history": [], "summary": {}}
    for record in records_of(wandb_file):
        kind = record["type"]
        if kind == "run":
            found["run"] = record["run"]
        elif kind == "history":
            found["history"].append(record["history"]["item"])
        elif kind == "summary":
            found["summary"].update(record["summary"].get("update", {}))
        elif kind == "exit":
            found["exit_code"] = record["exit"].get("exit_code", 0)
    return found


def by_step(history: list[dict[str, Any]], key: str) -> dict[int, float]:
    return {int(row[STEP]): row[key] for row in history if key in row}


def tensorboard_tags(run_dir: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return set(events.Tags()["scalars"])


@pytest.mark.slow
@pytest.mark.interrupts
def test_preempted_run_resumed_on_another_vm_continues_its_wandb_run(
    gcs_bucket: str, gated_src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It logs to W&B offline (by config, then by WANDB_MODE) what TensorBoard gets, step by
    step; W&B's files hold summary.json's losses and eval, the config, the report and the
    goodput of both attempts; the resumed attempt on another VM finds the run id beside the
    gs:// checkpoints and continues that run's history from the step it restored, and
    `wandb sync` takes both attempts as that run's."""
    remote = f"{gcs_bucket}/runs/week1"
    gate = Gate(tmp_path / "gate", steps=8)  # SIGTERM after step 8
    config = write_config(
        tmp_path, gate=gate, max_steps=STEPS, log_every=1, eval_every=4, checkpoint_every=4,
        seed=3, goodput="local",
    )  # fmt: skip
    args = ("train", "--config", str(config), "--checkpoint-dir", remote, "--resume", "auto")
    args += (*WANDB, "--set", "wandb.project=week1", "--set", 'wandb.tags=["spot"]')
    first, second = tmp_path / "first-vm", tmp_path / "second-vm"
    monkeypatch.delenv("WANDB_MODE")
    offline = ("--set", "wandb.mode=offline")  # the first VM: offline by its config
    stopped = preempt((*args, "--run-dir", str(first), *offline), first, gate, gated_src)
    monkeypatch.setenv("WANDB_MODE", "offline")  # the second VM: offline by its environment
    resumed = cli(*args, "--run-dir", str(second), src=gated_src)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((second / "summary.json").read_text())

    kept = json.loads(store.read_text(store.records_location(remote), RUN_ID) or "{}")
    before, after = attempt(first), attempt(second)
    assert before["run"]["run_id"] == after["run"]["run_id"] == kept["id"]
    assert after["run"]["resume"] and not before["run"].get("resume")
    assert after["run"]["project"] == "week1" and after["run"]["tags"] == ["spot"]
    assert (before["exit_code"], after["exit_code"]) == (EXIT_PREEMPTED, 0)

    # The history: the first attempt's steps, then the second's from the restored step on.
    losses_before = by_step(before["history"], "train/loss")
    losses_after = by_step(after["history"], "train/loss")
    assert min(losses_after) == stopped["steps"] + 1 and max(losses_after) == STEPS
    assert max(losses_before) >= stopped["steps"]
    assert {**losses_before, **losses_after} == dict(summary["train_losses"])
    assert by_step(after["history"], "eval/loss")[STEPS] == summary["eval"]["loss"]
    logged = {key for row in after["history"] for key in row if not key.startswith("_")}
    assert logged - {STEP} == tensorboard_tags(second)  # the same figures as TensorBoard

    run_config = after["run"]["config"]["update"]
    assert run_config["max_steps"] == STEPS and run_config["loggers"] == ["tensorboard", "wandb"]
    assert after["summary"]["status"] == "completed"
    assert after["summary"]["final_train_loss"] == summary["final_train_loss"]
    assert f"resuming at step {stopped['steps']}" in " ".join(after["summary"]["report"])
    goodput = after["summary"]["goodput"]  # the account of the whole run: both attempts
    assert (goodput["attempts"], goodput["disruptions"]) == (2, 1)
    assert goodput["max_productive_step"] == STEPS
    assert summary["diagnosis"] == []  # no device read beyond the logged ones

    synced = subprocess.run(
        [sys.executable, "-m", "wandb", "sync", "--dry-run", str(first / "wandb"),
         str(second / "wandb")],
        env={**os.environ, "WANDB_MODE": "offline"}, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    files = [line for line in synced.stderr.splitlines() if f"run-{kept['id']}.wandb" in line]
    assert synced.returncode == 0 and len(files) == 2, synced.stderr
    assert sorted(str(first) in line for line in files) == [False, True]  # one per attempt


def test_online_run_without_a_key_is_refused_in_one_line(tmp_path: Path) -> None:
    """It stops before the first step with one line saying how to log in or log offline."""
    config = write_config(tmp_path, max_steps=2, log_every=1)
    env = {**cli_env(), "HOME": str(tmp_path), "WANDB_BASE_URL": "http://127.0.0.1:9"}
    env.pop("WANDB_API_KEY", None)
    env.pop("WANDB_MODE", None)
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "train", "--config"]
    result = subprocess.run(
        [*command, str(config), "--run-dir", str(tmp_path / "run"), "--set", "loggers=wandb"],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: W&B could not start the run (No API key configured. Use `wandb login` to log "
        "in.): on the host that logs (worker 0), `wandb login` or set WANDB_API_KEY; or log "
        "offline with --set wandb.mode=offline and `wandb sync` later"
    ]
    assert not (tmp_path / "run" / "summary.json").exists()


def test_wandb_without_the_package_is_refused_in_one_line(tmp_path: Path) -> None:
    """It names the extra to install when `wandb` is missing, before anything starts."""
    blocked = "import sys; sys.modules['wandb'] = None; "
    run = "from {{ cookiecutter.package_name }}.cli import main; main()"
    result = subprocess.run(
        [sys.executable, "-c", blocked + run, "train", "--accelerator", "cpu", "--run-dir",
         str(tmp_path / "run"), "--set", "loggers=tensorboard,wandb"],
        env=cli_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: loggers names \"wandb\", which needs the wandb package: pip install -e '.[wandb]'"
    ]
    assert not (tmp_path / "run").exists()
