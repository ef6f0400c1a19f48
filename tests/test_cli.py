"""The real `cookiecutter` command bakes the template as the README says."""

from __future__ import annotations

import ast
import filecmp
import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

Run = Callable[..., subprocess.CompletedProcess[str]]

# Quotes, backslashes and Python that would run if a value were pasted into code.
PAYLOAD = "__import__('os').system('touch PWNED')"
HOSTILE_DESCRIPTION = (
    f'Breaks out: """ + {PAYLOAD} + """ and \'\'\' {PAYLOAD} \'\'\' \\ \\n \\" end'
)
HOSTILE_NAMES = [
    pytest.param(f'x"""; {PAYLOAD}; """', id="triple-double-quotes"),
    pytest.param(f"x'''; {PAYLOAD}; '''", id="triple-single-quotes"),
    pytest.param(f'x\\"; {PAYLOAD} #', id="backslash-quote"),
]


def differing_files(left: Path, right: Path) -> list[str]:
    """List files that differ or exist on one side only, recursively."""
    comparison = filecmp.dircmp(left, right)
    found = [*comparison.left_only, *comparison.right_only, *comparison.diff_files]
    for name in comparison.common_dirs:
        found += [f"{name}/{item}" for item in differing_files(left / name, right / name)]
    return found


def test_bakes_the_defaults(tmp_path: Path, run_cookiecutter: Run) -> None:
    """It bakes `cookiecutter <template> --no-input` into tpu-project/ and prints next steps,
    and leaves nothing in the temp folder (cookiecutter runs each hook from a copy there)."""
    temp = tmp_path / "temp"
    temp.mkdir()
    result = run_cookiecutter(tmp_path, temp_dir=temp)
    assert result.returncode == 0, result.stderr
    assert list(temp.iterdir()) == []
    assert (tmp_path / "tpu-project" / "src" / "tpu_project").is_dir()
    assert "cd tpu-project" in result.stdout
    assert "make train-single" in result.stdout


def test_bakes_the_readme_example(tmp_path: Path, run_cookiecutter: Run) -> None:
    """It derives slug and package from the project name and keeps the chosen task."""
    result = run_cookiecutter(
        tmp_path, context={"project_name": "My Model", "example_task": "vision"}
    )
    assert result.returncode == 0, result.stderr
    project = tmp_path / "my-model"
    pyproject = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["name"] == "my-model"
    assert (project / "src" / "my_model" / "tasks" / "vision.py").is_file()
    assert not (project / "src" / "my_model" / "tasks" / "lm.py").exists()


def test_bakes_a_v5p_16_pod_with_two_hosts_of_four_devices(
    tmp_path: Path, run_cookiecutter: Run
) -> None:
    """It bakes v5p-16 with v5p's defaults and a runtime that counts 2 hosts x 4 devices."""
    result = run_cookiecutter(tmp_path, context={"accelerator_type": "v5p-16"})
    assert result.returncode == 0, result.stderr
    project = tmp_path / "tpu-project"
    makefile = (project / "Makefile").read_text(encoding="utf-8")
    for line in (
        "ACCELERATOR_TYPE ?= v5p-16",
        "ZONE ?= us-east5-a",
        "RUNTIME_VERSION ?= v2-alpha-tpuv5",
    ):
        assert line in makefile.splitlines()
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    layout = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tpu_project.core.runtime import topology, peak_bf16_flops_per_chip as peak; "
            "t = topology('v5p-16'); print(t.hosts, t.devices_per_host, peak('v5p-16'))",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert layout.returncode == 0, layout.stderr
    assert layout.stdout.split() == ["2", "4", "459000000000000.0"]
    pod_run = ["pod", "run", "--tpu", "t", "--dry-run", "--accelerator-type", "v5p-16"]
    dry_run = subprocess.run(
        [sys.executable, "-m", "tpu_project", *pod_run, "--", "hostname"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert dry_run.returncode == 0, dry_run.stderr
    workers = [line.split("--worker=")[1].split()[0] for line in dry_run.stdout.splitlines()]
    assert workers == ["0", "1"]


def test_rebakes_the_same_project_from_recorded_answers(
    tmp_path: Path, run_cookiecutter: Run
) -> None:
    """It reproduces the project exactly from its .cookiecutter.json via --replay-file."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    context = {"project_name": "Replay Me", "accelerator_type": "v4-32", "example_task": "vision"}
    assert run_cookiecutter(first, context=context).returncode == 0
    answers = first / "replay-me" / ".cookiecutter.json"

    result = run_cookiecutter(second, "--replay-file", str(answers), no_input=False)

    assert result.returncode == 0, result.stderr
    assert differing_files(first / "replay-me", second / "replay-me") == []


def test_treats_a_hostile_description_as_data(tmp_path: Path, run_cookiecutter: Run) -> None:
    """It bakes quotes, backslashes and code in the description verbatim and runs none of it."""
    out = tmp_path / "out"
    out.mkdir()
    result = run_cookiecutter(
        out,
        context={"project_name": "Safe Name", "description": HOSTILE_DESCRIPTION},
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    project = out / "safe-name"
    pyproject = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["description"] == HOSTILE_DESCRIPTION
    recorded = json.loads((project / ".cookiecutter.json").read_text(encoding="utf-8"))
    assert recorded["cookiecutter"]["description"] == HOSTILE_DESCRIPTION
    for source in project.rglob("*.py"):
        ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
    assert list(tmp_path.rglob("PWNED")) == []


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_treats_a_hostile_project_name_as_data(
    tmp_path: Path, run_cookiecutter: Run, name: str
) -> None:
    """It refuses a name that tries to break out of a string, without running it."""
    out = tmp_path / "out"
    out.mkdir()
    result = run_cookiecutter(out, context={"project_name": name}, cwd=tmp_path)
    assert result.returncode != 0
    assert result.stderr.startswith("ERROR: project_name "), result.stderr
    assert "contains quotes or shell metacharacters" in result.stderr.splitlines()[0]
    assert list(out.iterdir()) == []
    assert list(tmp_path.rglob("PWNED")) == []
