"""The trainer end to end on XLA:CPU: resume, preemption, atomic checkpoints, eval."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from {{ cookiecutter.package_name }}.training.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
)

from training_helpers import cli, cli_env, popen, write_config

STEPS = 24


def _summary(run_dir: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((run_dir / "summary.json").read_text())


def _wait_for(process: subprocess.Popen[str], marker: str) -> list[str]:
    """Read the process's output until a line contains `marker`."""
    seen = []
    assert process.stdout is not None
    for line in process.stdout:
        seen.append(line)
        if marker in line:
            return seen
    raise AssertionError(f"{marker!r} never printed:\n{''.join(seen)}")


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run logging every step's loss."""
    folder = tmp_path_factory.mktemp("reference")
    config = write_config(folder, max_steps=STEPS, log_every=1, seed=5)
    result = cli("train", "--config", str(config), "--run-dir", str(folder / "run"))
    assert result.returncode == 0, result.stderr
    return folder / "run"


def test_run_writes_summary_tensorboard_and_checkpoint(reference_run: Path) -> None:
    """It leaves a summary, TensorBoard events and a final checkpoint in the run directory."""
    summary = _summary(reference_run)
    assert summary["steps"] == STEPS and summary["status"] == "completed"
    assert len(summary["train_losses"]) == STEPS
    assert summary["fallback_ops"] == {}
    assert list((reference_run / "tensorboard").glob("events.out.tfevents.*"))
    assert (
        latest_checkpoint(reference_run) == reference_run / "checkpoints" / f"step-{STEPS:08d}.pt"
    )


def test_sigterm_then_resume_matches_uninterrupted_run(reference_run: Path, tmp_path: Path) -> None:
    """It saves and exits 0 on SIGTERM, and the resumed losses equal an unbroken run's."""
    config = write_config(tmp_path, max_steps=STEPS, log_every=1, seed=5)
    run_dir = tmp_path / "run"
    process = popen("train", "--config", str(config), "--run-dir", str(run_dir))
    _wait_for(process, "step 8 train")
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    assert "stopped by SIGTERM" in output
    stopped = _summary(run_dir)
    assert stopped["status"] == "preempted" and 8 <= stopped["steps"] < STEPS

    resumed = cli("train", "--config", str(config), "--run-dir", str(run_dir), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming at step {stopped['steps']}" in resumed.stdout
    assert _summary(run_dir)["train_losses"] == _summary(reference_run)["train_losses"]


def test_kill_during_checkpoint_write_keeps_previous_loadable(tmp_path: Path) -> None:
    """It never leaves a half-written file among the checkpoints when killed with -9."""
    config = write_config(tmp_path, max_steps=400, log_every=0, checkpoint_every=1, seed=1)
    run_dir = tmp_path / "run"
    folder = run_dir / "checkpoints"
    process = popen("train", "--config", str(config), "--run-dir", str(run_dir))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if len(list_checkpoints(run_dir)) >= 1 and list(folder.glob(".tmp-*")):
            break
        time.sleep(0.001)
    process.kill()
    process.wait()
    assert list_checkpoints(run_dir), "no checkpoint was written before the kill"
    for path in list_checkpoints(run_dir):
        assert load_checkpoint(path)["progress"]["step"] == int(path.stem.split("-")[1])


def test_checkpoint_loads_without_torch_xla(reference_run: Path) -> None:
    """It loads a checkpoint on CPU in a process where torch_xla cannot be imported."""
    path = latest_checkpoint(reference_run)
    code = (
        "import sys; sys.modules['torch_xla'] = None\n"
        "import torch\n"
        f"state = torch.load({str(path)!r}, map_location='cpu', weights_only=True)\n"
        "print(state['progress']['step'], next(iter(state['model'].values())).device)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(STEPS), "cpu"]


def test_eval_on_8_spmd_devices_equals_one_device(reference_run: Path) -> None:
    """It reports the same eval metrics on 8 SPMD devices as on one device."""
    path = str(latest_checkpoint(reference_run))
    one = cli("eval", "--checkpoint", path, "--devices", "1")
    eight = cli("eval", "--checkpoint", path, "--devices", "8", "--strategy", "spmd")
    assert one.returncode == 0, one.stderr
    assert eight.returncode == 0, eight.stderr
    single, sharded = json.loads(one.stdout), json.loads(eight.stdout)
    assert single.keys() == sharded.keys()
    for key, value in single.items():
        assert sharded[key] == pytest.approx(value, rel=1e-5), key
