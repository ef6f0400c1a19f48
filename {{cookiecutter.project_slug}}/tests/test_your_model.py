"""docs/your-model.md works as written: its task module and config train end to end."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from backend_facts import TRAIN_GRAPHS_ONE_DEVICE
from training_helpers import cli_env

PROJECT = Path(__file__).resolve().parents[1]
DOC = PROJECT / "docs" / "your-model.md"
PACKAGE = "{{ cookiecutter.package_name }}"


def fenced(language: str) -> str:
    """The first code block of `language` in the doc."""
    blocks = re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks, f"no {language} block in {DOC.name}"
    return str(blocks[0])


@pytest.fixture(scope="module")
def project_with_my_task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of this project with the doc's module and config added, as a newcomer would."""
    copy = tmp_path_factory.mktemp("newcomer")
    shutil.copytree(PROJECT / "src", copy / "src")
    (copy / "src" / PACKAGE / "tasks" / "my_task.py").write_text(fenced("python"))
    (copy / "configs").mkdir()
    (copy / "configs" / "my-task.toml").write_text(fenced("toml"))
    return copy


def test_doc_snippet_trains_as_a_new_task(project_with_my_task: Path) -> None:
    """It trains the doc's task from its config: the loss falls and eval is accurate."""
    copy = project_with_my_task
    env = {**cli_env(), "PYTHONPATH": str(copy / "src")}
    command = [sys.executable, "-m", PACKAGE, "train", "--config", "configs/my-task.toml"]
    done = subprocess.run(
        [*command, "--accelerator", "cpu", "--run-dir", "runs/my-task", "--max-steps", "200"],
        cwd=copy, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tied parameters: none" in done.stdout
    summary = json.loads((copy / "runs" / "my-task" / "summary.json").read_text())
    losses = [loss for _, loss in summary["train_losses"]]
    assert losses[-1] < 0.5 * losses[0], losses
    assert summary["eval"]["accuracy"] > 0.85, summary["eval"]
    assert summary["loop_compilations"] == TRAIN_GRAPHS_ONE_DEVICE + 1  # and one eval graph
    assert os.path.isdir(copy / "runs" / "my-task" / "checkpoints")


def test_doc_snippet_is_lint_clean(project_with_my_task: Path) -> None:
    """It passes the project's own ruff rules, as code a newcomer pastes should."""
    module = project_with_my_task / "src" / PACKAGE / "tasks" / "my_task.py"
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--config", str(PROJECT / "pyproject.toml"),
         str(module)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
