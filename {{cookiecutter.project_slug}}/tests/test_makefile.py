"""The Makefile's local training targets really train, on XLA:CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def _train(target: str, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """Two steps of the tiny run through a make target; its output and summary."""
    config = write_config(tmp_path, max_steps=2, log_every=1)
    run_dir = tmp_path / "run"
    result = _make(target, "ACCELERATOR=cpu", f"ARGS=--config {config} --run-dir {run_dir}")
    assert result.returncode == 0, result.stderr
    return result.stdout, json.loads((run_dir / "summary.json").read_text())


def test_make_train_single_trains_on_xla_cpu(tmp_path: Path) -> None:
    """It trains on one device through `make train-single`."""
    _, summary = _train("train-single", tmp_path)
    assert (summary["strategy"], summary["devices"], summary["steps"]) == ("single", 1, 2)
    assert summary["loop_compilations"] == 1


def test_make_train_8_runs_spmd_on_8_cpu_devices(tmp_path: Path) -> None:
    """It emulates 8 devices through SPMD with `make train-8 ACCELERATOR=cpu`."""
    output, summary = _train("train-8", tmp_path)
    assert (summary["strategy"], summary["devices"], summary["steps"]) == ("spmd", 8, 2)
    assert summary["loop_compilations"] == 1, "the second SPMD step compiled a graph of its own"
    assert "spmd on 8 XLA:CPU device(s), 1 process(es)" in output


def test_make_install_takes_torch_from_torch_index_url() -> None:
    """It installs torch from TORCH_INDEX_URL before the project, and from the index without."""
    index = "https://download.pytorch.org/whl/cpu"
    named = _make("-n", "install", f"TORCH_INDEX_URL={index}").stdout.splitlines()
    torch_line = f"--index-url '{index}' torch==2.9.0"
    first = next(i for i, line in enumerate(named) if torch_line in line)
    project = next(i for i, line in enumerate(named) if "-e '.[dev]'" in line)
    assert first < project, named
    plain = _make("-n", "install").stdout
    assert "--index-url" not in plain and "-e '.[dev]'" in plain
