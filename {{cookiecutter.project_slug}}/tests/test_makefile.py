"""The Makefile's local training targets really train off a TPU, and its install takes the
project's own torch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from backend_facts import CPU_KIND, REPLICATED, TRAIN_8_DEVICES, one_graph_per_step_kind
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


def _train(target: str, folder: Path, *args: str) -> tuple[str, dict[str, Any]]:
    """Two steps of the tiny run through a make target (`args` after its own); its output and
    summary."""
    config = write_config(folder, max_steps=2, log_every=1)
    run_dir = folder / "run"
    options = " ".join(["--config", str(config), "--run-dir", str(run_dir), *args])
    result = _make(target, "ACCELERATOR=cpu", f"ARGS={options}")
    assert result.returncode == 0, result.stderr
    return result.stdout, json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def train_single(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """`make train-single`'s run: its output and summary."""
    return _train("train-single", tmp_path_factory.mktemp("train-single"))


@pytest.fixture(scope="module")
def train_8(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """`make train-8 ACCELERATOR=cpu`'s run: its output and summary (on fewer devices where
    each is a process to start)."""
    fewer = () if TRAIN_8_DEVICES == 8 else ("--devices", str(TRAIN_8_DEVICES))
    return _train("train-8", tmp_path_factory.mktemp("train-8"), *fewer)


def test_make_train_single_trains_on_one_device(train_single: tuple[str, dict[str, Any]]) -> None:
    """It trains on one device through `make train-single`."""
    _, summary = train_single
    assert (summary["strategy"], summary["devices"], summary["steps"]) == ("single", 1, 2)


def test_make_train_8_runs_8_cpu_devices(train_8: tuple[str, dict[str, Any]]) -> None:
    """It trains on CPU devices with `make train-8 ACCELERATOR=cpu`: 8 under spmd on torch_xla,
    one process each under ddp on torch_tpu (2 here: `--devices 2` after the target's)."""
    output, summary = train_8
    devices = TRAIN_8_DEVICES
    assert (summary["strategy"], summary["devices"], summary["steps"]) == (REPLICATED, devices, 2)
    assert f"{REPLICATED} on {devices} {CPU_KIND} device(s)" in output


@one_graph_per_step_kind
@pytest.mark.parametrize("target", ["train_single", "train_8"])
def test_make_train_targets_compile_one_graph(target: str, request: pytest.FixtureRequest) -> None:
    """It compiles one graph for the training step: the second step compiles none."""
    _, summary = request.getfixturevalue(target)
    assert summary["loop_compilations"] == 1


def test_make_install_takes_torch_from_torch_index_url() -> None:
    """It installs the torch the project pins from TORCH_INDEX_URL before the project (whose
    install keeps it), and from the index without."""
    index = "https://download.pytorch.org/whl/cpu"
    named = _make("-n", "install", f"TORCH_INDEX_URL={index}").stdout.splitlines()
    (pinned,) = re.findall(r'"(torch==[^"]+)"', (PROJECT / "pyproject.toml").read_text())
    torch_line = f"--index-url '{index}' '{pinned}'"
    first = next(i for i, line in enumerate(named) if torch_line in line)
    project = next(i for i, line in enumerate(named) if "-e '.[dev]'" in line)
    assert first < project, named
    plain = _make("-n", "install").stdout
    assert "--index-url" not in plain and "-e '.[dev]'" in plain


@pytest.mark.parametrize("target", ["train-single", "train-8"])
def test_training_targets_train_the_examples_config_unless_args_name_another(
    target: str,
) -> None:
    """It gives `train` the example's config first, so a `--config` in ARGS (read last) wins."""
    config = "configs/{{ cookiecutter.example_task }}.toml"

    def train_line(*args: str) -> str:
        (line,) = [x for x in _make("-n", target, *args).stdout.splitlines() if " train " in x]
        return line

    assert f" train --config {config} " in train_line(), train_line()
    assert (PROJECT / config).is_file()
    mine = train_line("ARGS=--config mine.toml")
    assert mine.index(f"--config {config}") < mine.index("--config mine.toml"), mine


def test_targets_run_on_a_worker_with_the_startup_scripts_environment(tmp_path: Path) -> None:
    """It runs the project with the startup script's venv where `make install` made none (a
    TPU VM worker after `pod sync`), and with VENV's once it exists."""
    worker_python = tmp_path / "opt" / "bin" / "python"
    worker_python.parent.mkdir(parents=True)
    worker_python.symlink_to(sys.executable)
    args = [f"WORKER_VENV={tmp_path / 'opt'}", "-n", "train-single"]
    env = cli_env()
    shown = subprocess.run(
        ["make", "-C", str(PROJECT), f"VENV={tmp_path / 'none'}", *args],
        env=env, capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    assert f"{worker_python} -m {{ cookiecutter.package_name }} train " in shown, shown
    own = _make(*args).stdout
    assert f"{sys.prefix}/bin/python -m {{ cookiecutter.package_name }} train " in own, own
