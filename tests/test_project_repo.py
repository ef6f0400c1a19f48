"""The baked project as a repository: CI workflow, pre-commit hooks, cruft updates."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from helpers import BIN_DIR, TEMPLATE_DIR, Baked, tool_env

COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "__pycache__", ".*_cache")


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def _repo_copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target, ignore=COPY_IGNORE)
    _git(target, "init", "-q", "-b", "main")
    _git(target, "add", "-A")
    _git(target, "commit", "-q", "-m", "initial")
    return target


def test_workflow_renders_to_yaml_with_lint_and_test_jobs(
    bake_combo: Callable[[str], Baked],
) -> None:
    """It renders the GitHub workflow as YAML whose jobs run make lint and make test."""
    baked = bake_combo("default-lm")
    text = (baked.path / ".github" / "workflows" / "ci.yml").read_text()
    assert "${{ github.workflow }}-${{ github.ref }}" in text
    workflow = yaml.safe_load(text)
    triggers = workflow.get("on", workflow.get(True))
    assert set(triggers) == {"push", "pull_request"}
    jobs = workflow["jobs"]
    assert set(jobs) == {"lint", "test"}
    for name, command in (("lint", "make lint"), ("test", "make test")):
        steps = jobs[name]["steps"]
        assert command in [step.get("run") for step in steps]
        setup = next(s for s in steps if s.get("uses", "").startswith("actions/setup-python"))
        assert setup["with"]["cache"] == "pip"
        assert setup["with"]["python-version"] == baked.context["python_version"]
    assert jobs["test"]["env"]["PJRT_DEVICE"] == "CPU"


def _pre_commit(project: Path, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN_DIR / "pre-commit"), "run", "--all-files"],
        cwd=project,
        env=tool_env(PRE_COMMIT_HOME=str(home)),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_pre_commit_passes_on_a_fresh_bake(
    bake_combo: Callable[[str], Baked], tmp_path: Path
) -> None:
    """It passes every pre-commit hook on the first bake, offline."""
    project = _repo_copy(bake_combo("vision-bf16-mixed-spmd").path, tmp_path / "project")
    result = _pre_commit(project, tmp_path / "pre-commit-home")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ruff check" in result.stdout and "Passed" in result.stdout


def test_pre_commit_catches_an_unformatted_file(
    bake_combo: Callable[[str], Baked], tmp_path: Path
) -> None:
    """It fails when a committed file breaks the formatting rules."""
    project = _repo_copy(bake_combo("default-lm").path, tmp_path / "project")
    (project / "extra.py").write_text("x  =  1   \n")
    _git(project, "add", "extra.py")
    result = _pre_commit(project, tmp_path / "pre-commit-home")
    assert result.returncode != 0
    assert "Failed" in result.stdout


def _cruft(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN_DIR / "cruft"), *args],
        cwd=cwd,
        env=tool_env(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com",
                     GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com"),
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize("task", ["lm"])
def test_cruft_update_applies_a_template_change(tmp_path: Path, task: str) -> None:
    """It updates an untouched project to a newer template commit, cleanly."""
    template = _repo_copy(TEMPLATE_DIR, tmp_path / "template")
    created = _cruft(
        "create", str(template), "--no-input", "--output-dir", str(tmp_path / "out"),
        "--extra-context", f'{{"example_task": "{task}"}}', cwd=tmp_path,
    )  # fmt: skip
    assert created.returncode == 0, created.stdout + created.stderr
    project = tmp_path / "out" / "tpu-project"
    assert (project / ".cruft.json").is_file()
    _git(project, "init", "-q", "-b", "main")
    _git(project, "add", "-A")
    _git(project, "commit", "-q", "-m", "baked")
    assert _cruft("check", cwd=project).returncode == 0

    readme = template / "{{cookiecutter.project_slug}}" / "README.md"
    readme.write_text(readme.read_text() + "\nUpdated by the template.\n")
    _git(template, "commit", "-q", "-am", "template change")
    assert _cruft("check", cwd=project).returncode != 0

    updated = _cruft("update", "--skip-apply-ask", cwd=project)
    assert updated.returncode == 0, updated.stdout + updated.stderr
    assert "Updated by the template." in (project / "README.md").read_text()
    assert _cruft("check", cwd=project).returncode == 0
