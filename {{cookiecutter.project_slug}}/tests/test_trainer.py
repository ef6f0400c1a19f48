"""Training end to end off a TPU: resume, preemption, checkpoints that survive, eval, export."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from {{ cookiecutter.package_name }}.core.checkpoint_files import (
    COMMIT_MARKER,
    completed_steps,
    find_checkpoint,
)
from {{ cookiecutter.package_name }}.core.checkpointing import read, saved_keys

from backend_facts import REPLICATED, many
from gates import Gate
from gcs_emulator import ObjectGate
from training_helpers import cli, cli_env, popen, preempt_then_resume, write_config

pytestmark = pytest.mark.slow  # several end-to-end runs: `make test-fast` skips them

STEPS = 24


def summary_of(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "summary.json").read_text()))


def full_state(path: Path | str) -> dict[str, Any]:
    """Every tensor of a checkpoint, read on the CPU with torch alone."""
    import torch

    from {{ cookiecutter.package_name }}.core.checkpoint_files import reader

    metadata = reader(str(path)).read_metadata().state_dict_metadata
    state = {
        key: torch.empty(entry.size, dtype=entry.properties.dtype)
        for key, entry in metadata.items()
        if hasattr(entry, "size")
    }
    read(str(path), state)
    return state


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
    summary = summary_of(reference_run)
    assert summary["steps"] == STEPS and summary["status"] == "completed"
    assert len(summary["train_losses"]) == STEPS
    assert summary["fallback_ops"] == {} and summary["diagnosis"] == []
    assert list((reference_run / "tensorboard").glob("events.out.tfevents.*"))
    assert summary["checkpoint"] == str(reference_run / "checkpoints" / str(STEPS))
    assert completed_steps(str(reference_run / "checkpoints")) == [STEPS]


@pytest.mark.interrupts
def test_sigterm_then_resume_matches_uninterrupted_run(
    reference_run: Path, gated_src: Path, tmp_path: Path
) -> None:
    """It saves and exits 75 on SIGTERM, and the resumed losses equal an unbroken run's."""
    gate = Gate(tmp_path / "gate", steps=8)  # SIGTERM after step 8
    config = write_config(tmp_path, gate=gate, max_steps=STEPS, log_every=1, seed=5)
    run_dir = tmp_path / "run"
    args = ("train", "--config", str(config), "--run-dir", str(run_dir))
    resumed = preempt_then_resume(args, run_dir, gate, gated_src)
    assert resumed["train_losses"] == summary_of(reference_run)["train_losses"]


def test_a_later_sigterm_is_the_same_request_and_leaves_the_save_alone(
    python_subprocess: Any,
) -> None:
    """It takes a SIGTERM after the loop stopped on one as the same request: a VM going down
    signals every process and a launcher sends its own on, while the run saves."""
    code = (
        "import json, os, signal\n"
        "from {{ cookiecutter.package_name }}.training.watch import Preemption\n"
        "with Preemption() as preemption:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "os.kill(os.getpid(), signal.SIGTERM)  # after the loop, as the run saves\n"
        "print(json.dumps({'asked': preemption.requested, 'saved': True}))\n"
    )
    assert python_subprocess(["-c", code]) == {"asked": True, "saved": True}


def test_resume_auto_starts_fresh_and_latest_needs_a_checkpoint(tmp_path: Path) -> None:
    """It trains from scratch under --resume auto, and refuses --resume latest with one line."""
    config = write_config(tmp_path, max_steps=2, log_every=1)
    run_dir = tmp_path / "run"
    latest = cli("train", "--config", str(config), "--run-dir", str(run_dir), "--resume", "latest")
    assert latest.returncode == 2
    assert latest.stderr.strip().splitlines() == [
        f"error: --resume latest: no checkpoint in {str(run_dir / 'checkpoints')!r}; "
        "use --resume auto to start fresh when there is none"
    ]
    fresh = cli("train", "--config", str(config), "--run-dir", str(run_dir), "--resume", "auto")
    assert fresh.returncode == 0, fresh.stderr
    assert "resuming" not in fresh.stdout and summary_of(run_dir)["steps"] == 2


@pytest.mark.interrupts
def test_kill_during_async_checkpoint_write_keeps_previous_loadable(
    gated_gcs_bucket: tuple[str, ObjectGate], tmp_path: Path
) -> None:
    """It never loses the previous checkpoint when killed with -9 during a background save."""
    bucket, gate = gated_gcs_bucket
    folder = f"{bucket}/run/checkpoints"
    config = write_config(tmp_path, max_steps=STEPS, log_every=0, checkpoint_every=1, seed=1)
    args = ("--run-dir", str(tmp_path / "run"), "--checkpoint-dir", folder)
    # The save of step 2 stops at its last file, the commit marker: the run is mid-save.
    gate.hold(f"{folder[5:].split('/', 1)[1]}/2/{COMMIT_MARKER}")
    process = popen("train", "--config", str(config), *args)
    try:
        gate.held(process)
    finally:
        process.kill()
        process.communicate()
        gate.release(drop=True)  # the machine died: its upload never completes
    assert completed_steps(folder) == [1]
    assert saved_keys(f"{folder}/2"), "step 2's shards and metadata were written"
    assert find_checkpoint(folder) == f"{folder}/1"  # what --resume picks
    state: dict[str, Any] = {"progress": None}
    read(f"{folder}/1", state)
    assert state["progress"]["step"] == 1
    assert len(full_state(f"{folder}/1")) > 0


def test_checkpoint_reads_without_torch_xla(reference_run: Path) -> None:
    """It reads a checkpoint's weights on CPU in a process where torch_xla cannot be imported."""
    path = reference_run / "checkpoints" / str(STEPS)
    code = (
        "import sys; sys.modules['torch_xla'] = None\n"
        "from {{ cookiecutter.package_name }}.core.checkpointing import read\n"
        "state = {'progress': None, 'config': None}\n"
        f"read({str(path)!r}, state)\n"
        "print(state['progress']['step'], state['config']['task'])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(STEPS), "{{ cookiecutter.example_task }}"]
    assert any(key.startswith("model.") for key in saved_keys(str(path)))


def test_eval_on_many_devices_equals_one_device(reference_run: Path) -> None:
    """It reports the same eval metrics on several devices (spmd, ddp) as on one device."""
    path = str(reference_run / "checkpoints")  # a directory: its newest checkpoint
    one = cli("eval", "--checkpoint", path, "--devices", "1")
    eight = cli("eval", "--checkpoint", path, *many(REPLICATED))
    assert one.returncode == 0, one.stderr
    assert eight.returncode == 0, eight.stderr
    single, sharded = json.loads(one.stdout), json.loads(eight.stdout)
    assert single.keys() == sharded.keys()
    for key, value in single.items():
        assert sharded[key] == pytest.approx(value, rel=1e-5), key


def test_diverging_run_stops_with_one_line_and_saves_no_nan(tmp_path: Path) -> None:
    """It stops a run whose loss turns NaN with exit code 3, and no checkpoint holds NaN."""
    config = write_config(tmp_path, max_steps=30, log_every=5, checkpoint_every=5, seed=2)
    run_dir = tmp_path / "run"
    result = cli("train", "--config", str(config), "--run-dir", str(run_dir), "--lr", "1e6")

    assert result.returncode == 3, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: training diverged"), result.stderr
    summary = summary_of(run_dir)
    assert summary["status"] == "diverged" and summary["steps"] < 30
    assert f"at step {summary['diverged_at']}, so nothing was saved" in lines[0]
    last = summary["checkpoint"]
    assert (f"last good checkpoint: {last}" if last else "no checkpoint was written") in lines[0]
    assert not math.isfinite(summary["train_losses"][-1][1])
    for step in completed_steps(str(run_dir / "checkpoints")):
        tensors = full_state(run_dir / "checkpoints" / str(step))
        assert all(t.isfinite().all() for t in tensors.values() if t.is_floating_point()), step


def test_export_loads_in_plain_torch_with_the_trained_logits(
    reference_run: Path, tmp_path: Path, python_subprocess: Any
) -> None:
    """It exports one safetensors file that a CPU-only process turns back into the model."""
    out = tmp_path / "model.safetensors"
    exported = cli("export", "--checkpoint", str(reference_run / "checkpoints"), "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    on_device = python_subprocess([__file__, "logits", str(reference_run / "checkpoints")])
    on_cpu = python_subprocess([__file__, "exported", str(out)], env={"PJRT_DEVICE": ""})

    import torch

    torch.testing.assert_close(
        torch.tensor(on_cpu["logits"]), torch.tensor(on_device["logits"]), rtol=1e-4, atol=1e-4
    )
    assert on_cpu["torch_xla_loaded"] is False


def sample_input(task: Any) -> Any:
    """A fixed input batch of the task's eval set."""
    import torch

    dataset = task.eval_dataset()
    return torch.stack([dataset[i]["x"] for i in range(4)])


def logits_of_checkpoint(location: str) -> dict[str, Any]:
    """The trained model's output on a fixed input, on one device (child process)."""
    from {{ cookiecutter.package_name }}.core import launch
    from {{ cookiecutter.package_name }}.training import build_config, plan_of
    from {{ cookiecutter.package_name }}.training.checkpoint import read_config

    _, saved = read_config(location)
    one_device = {"resume": "", "devices": "1", "strategy": "single", "mesh": ""}
    config = build_config(None, {**saved, **one_device})
    plan = plan_of(config)
    return dict(launch(checkpoint_logits, plan, (config, plan, location)))


def checkpoint_logits(config: Any, plan: Any, location: str) -> dict[str, Any]:
    import torch

    from {{ cookiecutter.package_name }}.tasks import load_task
    from {{ cookiecutter.package_name }}.training.checkpoint import load_weights

    task = load_task(config.task, options=config.task_options)
    model, _ = plan.strategy.setup_model(task.build_model())
    load_weights(location, plan.strategy, model)
    with torch.no_grad():
        logits = output_logits(model.eval()(sample_input(task).to(next(model.parameters()).device)))
    return {"logits": logits.cpu().tolist()}


def output_logits(output: Any) -> Any:
    """A model's logits: its output, or the `logits` of a transformers model's output."""
    return getattr(output, "logits", output)


def logits_of_export(path: str) -> dict[str, Any]:
    """The exported model's output on the same input, with torch_xla unimportable."""
    sys.modules["torch_xla"] = None  # type: ignore[assignment]
    import torch

    from {{ cookiecutter.package_name }}.tasks import load_task
    from {{ cookiecutter.package_name }}.training.export import load_exported

    model = load_exported(path)
    from safetensors import safe_open

    with safe_open(path, framework="pt") as handle:
        options = json.loads((handle.metadata() or {})["task_options"])
    task = load_task("{{ cookiecutter.example_task }}", options=options)
    with torch.no_grad():
        logits = output_logits(model(sample_input(task)))
    loaded = "torch_xla" in sys.modules and sys.modules["torch_xla"] is not None
    return {"logits": logits.tolist(), "torch_xla_loaded": loaded}


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    mode, where = sys.argv[1], sys.argv[2]
    result = logits_of_checkpoint(where) if mode == "logits" else logits_of_export(where)
    print(json.dumps(result))
