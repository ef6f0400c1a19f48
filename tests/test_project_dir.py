"""A project name or slug can never create or leave folders outside the output directory."""

from __future__ import annotations

import importlib
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import VALID_ANSWERS

Run = Callable[..., subprocess.CompletedProcess[str]]

# Slugs that are paths, not one folder name: refused while the answers are rendered,
# before cookiecutter creates the project directory.
PATH_SLUGS = {
    "parent": ("../x", "contains a path separator ('/')"),
    "grandparent": ("../../escaped", "contains a path separator ('/')"),
    "nested": ("a/b", "contains a path separator ('/')"),
    "absolute": ("/tmp/escaped", "contains a path separator ('/')"),
    "backslash": ("a\\b", "contains a path separator ('\\\\')"),
    "dot-dot": ("..", "names the output directory or its parent"),
    "dot": (".", "names the output directory or its parent"),
    "empty": ("", "is empty"),
}


def snapshot(root: Path) -> set[Path]:
    """Every path under root."""
    return set(root.rglob("*"))


@pytest.fixture
def sandbox(tmp_path: Path) -> tuple[Path, Path]:
    """An empty output directory two levels inside a directory the test watches."""
    out = tmp_path / "work" / "out"
    out.mkdir(parents=True)
    return tmp_path, out


@pytest.mark.parametrize(("slug", "problem"), PATH_SLUGS.values(), ids=PATH_SLUGS.keys())
def test_refuses_a_slug_that_is_a_path_before_writing_anything(
    sandbox: tuple[Path, Path], run_cookiecutter: Run, slug: str, problem: str
) -> None:
    """It stops with one ERROR line and creates nothing, in or outside the output folder."""
    watched, out = sandbox
    before = snapshot(watched)
    result = run_cookiecutter(out, context={"project_slug": slug}, cwd=out)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"ERROR: project_slug {slug!r} {problem}"), lines[0]
    assert snapshot(watched) == before
    assert not Path("/tmp/escaped").exists()


def test_refuses_a_path_slug_from_a_replayed_answers_file(
    sandbox: tuple[Path, Path], run_cookiecutter: Run
) -> None:
    """It refuses a hand-edited slug in --replay-file answers the same way."""
    watched, out = sandbox
    answers = watched / "answers.json"
    answers.write_text(json.dumps({"cookiecutter": {**VALID_ANSWERS, "project_slug": "../x"}}))
    before = snapshot(watched)
    result = run_cookiecutter(out, "--replay-file", str(answers), cwd=out, no_input=False)
    assert result.returncode == 1
    assert result.stderr.startswith("ERROR: project_slug '../x' contains a path separator")
    assert snapshot(watched) == before


@pytest.mark.parametrize(
    ("name", "slug"),
    [("AC/DC Model", "ac-dc-model"), ("../../Escape Hatch", "escape-hatch"), ("Résumé", "resume")],
)
def test_derives_one_folder_from_any_project_name(
    sandbox: tuple[Path, Path], run_cookiecutter: Run, name: str, slug: str
) -> None:
    """It turns slashes, dots and accents of the name into one plain folder name."""
    watched, out = sandbox
    result = run_cookiecutter(out, context={"project_name": name}, cwd=out)
    assert result.returncode == 0, result.stderr
    assert [p.name for p in out.iterdir()] == [slug]
    outside = {p for p in snapshot(watched) if out not in p.parents and p != out}
    assert outside == {watched / "work"}


def test_refused_names_leave_nothing_either(
    sandbox: tuple[Path, Path], run_cookiecutter: Run
) -> None:
    """It removes the one folder it made when the hook refuses a name with a slash."""
    watched, out = sandbox
    before = snapshot(watched)
    result = run_cookiecutter(out, context={"project_name": "a/b; rm -rf ~"}, cwd=out)
    assert result.returncode != 0
    assert result.stderr.startswith("ERROR: project_name 'a/b; rm -rf ~' contains quotes")
    assert snapshot(watched) == before


@pytest.mark.parametrize("slug", ["tpu-project", "x", "my-model-2"])
def test_guard_passes_plain_folder_names(slug: str) -> None:
    """It returns a plain folder name unchanged."""
    guard = importlib.import_module("local_extensions")
    assert guard.project_dir_name(slug) == slug
    assert guard.path_problem(slug) is None


def test_guard_exits_1_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """It prints the ERROR line to stderr and exits 1, like the pre-generation hook."""
    guard = importlib.import_module("local_extensions")
    with pytest.raises(SystemExit) as exited:
        guard.project_dir_name("../x")
    assert exited.value.code == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("ERROR: project_slug '../x'")
