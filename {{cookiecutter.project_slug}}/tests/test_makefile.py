"""The Makefile's local training targets really train, on XLA:CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from training_helpers import cli_env, write_config

PROJECT = Path(__file__).resolve().parents[1]


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    """Run a make target of this project with this interpreter's environment."""
    return subprocess.run(
        ["make", "-C", str(PROJECT), f"VENV={sys.prefix}", *args],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_make_train_single_trains_on_xla_cpu(tmp_path: Path) -> None:
    """It trains on one device through `make train-single`."""
    config = write_config(tmp_path, max_steps=2, log_every=1)
    run_dir = tmp_path / "run"
    result = _make("train-single", "ACCELERATOR=cpu", f"ARGS=--config {config} --run-dir {run_dir}")
    assert result.returncode == 0, result.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["strategy"], summary["devices"], summary["steps"]) == ("single", 1, 2)
    assert summary["loop_compilations"] == 1


def test_make_train_8_runs_spmd_on_8_cpu_devices(tmp_path: Path) -> None:
    """It emulates 8 devices through SPMD with `make train-8 ACCELERATOR=cpu`."""
    config = write_config(tmp_path, max_steps=2, log_every=1)
    run_dir = tmp_path / "run"
    result = _make("train-8", "ACCELERATOR=cpu", f"ARGS=--config {config} --run-dir {run_dir}")
    assert result.returncode == 0, result.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["strategy"], summary["devices"], summary["steps"]) == ("spmd", 8, 2)
    assert summary["loop_compilations"] == 1, "the second SPMD step compiled a graph of its own"
    assert "spmd on 8 XLA:CPU device(s), 1 process(es)" in result.stdout
