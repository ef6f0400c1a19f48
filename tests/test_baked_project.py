"""A baked project runs: it is lint-clean, and its commands start and install."""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import Baked, project_env, run, tool_env

# The bakes whose suites run (test_baked_suites.py, test_users_way.py), each lint-clean.
LINT_COMBOS = [
    "default-lm",
    "hf-causal-lm-fsdp-bf16-mixed",
    "vision-bf16-mixed-spmd",
    "v4-8-ddp-bf16-true",
]
CLI_COMBOS = ["default-lm", "v5litepod-32-own-names"]


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mypy cache for this module's lint runs, one after another on one worker: torch and
    transformers are analysed once, not once per bake (mypy rechecks every file that changed)."""
    return tmp_path_factory.mktemp("mypy-cache")


@pytest.mark.parametrize("combo", LINT_COMBOS)
def test_baked_project_make_lint_passes(
    combo: str, bake_combo: Callable[[str], Baked], mypy_cache: Path
) -> None:
    """It passes the baked project's own `make lint` (ruff, ruff format, mypy) on first bake."""
    baked = bake_combo(combo)
    env = project_env(baked, MYPY_CACHE_DIR=str(mypy_cache))
    result = run(["make", "lint", f"VENV={sys.prefix}"], env, cwd=baked.path, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "Success: no issues found" in result.stdout


@pytest.mark.parametrize("combo", CLI_COMBOS)
def test_console_script_shows_help(
    combo: str, bake_combo: Callable[[str], Baked], tmp_path: Path
) -> None:
    """It installs a console script named after the slug that prints the CLI's help."""
    baked = bake_combo(combo)
    assert baked.exit_code == 0, baked.exception
    target = tmp_path / "site"
    install = run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(baked.path),
        ],
        tool_env(PIP_NO_INDEX="1"),
    )
    assert install.returncode == 0, install.stdout + install.stderr
    script = target / "bin" / baked.context["project_slug"]
    assert script.is_file()

    result = run([str(script), "--help"], tool_env(PYTHONPATH=str(target), PJRT_DEVICE="CPU"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "train" in result.stdout


@pytest.mark.parametrize("combo", CLI_COMBOS)
def test_python_m_package_shows_help(combo: str, bake_combo: Callable[[str], Baked]) -> None:
    """It runs the CLI as `python -m <package> --help` without initialising XLA."""
    baked = bake_combo(combo)
    assert baked.exit_code == 0, baked.exception
    result = run(
        [sys.executable, "-m", baked.context["package_name"], "--help"],
        project_env(baked),
        cwd=baked.path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "train" in result.stdout


def test_make_install_installs_the_project(
    bake_combo: Callable[[str], Baked], tmp_path: Path
) -> None:
    """It installs the baked project, editable and with its console script, via `make install`."""
    project = tmp_path / "project"
    shutil.copytree(bake_combo("default-lm").path, project)
    try:
        installed = run(["make", "install", f"VENV={sys.prefix}"], tool_env(), project, 900)
        assert installed.returncode == 0, (installed.stdout + installed.stderr)[-3000:]
        where = run(
            [sys.executable, "-c", "import tpu_project; print(tpu_project.__file__)"],
            tool_env(),
            cwd=tmp_path,
        )
        assert where.returncode == 0, where.stderr
        assert Path(where.stdout.strip()).is_relative_to(project / "src")
        helped = run([str(Path(sys.prefix) / "bin" / "tpu-project"), "--help"], tool_env())
        assert helped.returncode == 0 and "train" in helped.stdout, helped.stderr
    finally:
        run(
            [sys.executable, "-m", "pip", "uninstall", "--quiet", "--yes", "tpu-project"],
            tool_env(),
        )


def test_readme_inventory_names_template_tests_that_exist(
    bake_combo: Callable[[str], Baked],
) -> None:
    """It names only template tests that exist, in the baked README's command inventory."""
    readme = (bake_combo("default-lm").path / "README.md").read_text()
    named = re.findall(r"template: (tests/[\w/]+\.py)::(\w+)", readme)
    assert named, "the inventory names no template test"
    template = Path(__file__).resolve().parents[1]
    missing = [
        f"{path}::{name}"
        for path, name in named
        if f"def {name}(" not in (template / path).read_text()
    ]
    assert not missing, missing
