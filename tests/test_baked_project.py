"""A baked project runs: its own test suite passes and its commands start."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import Baked, pytest_summary, tool_env

# What each bake runs of its own suite beside the default bake's, which runs whole and the
# user's way (test_users_way.py): the hf-causal-lm bake its Hugging Face tests whole and the
# quick tier of the tests its task changes; the vision bake the quick tier of those; the
# ddp/bf16-true bake the tests that read its baked strategy, precision and accelerator type.
SUITE_COMBOS = {
    "hf-causal-lm-fsdp-bf16-mixed": "-m 'hf or not slow' tests/test_hf_models.py "
    "tests/test_hf_moe.py tests/test_lora.py tests/test_hf_export.py "
    "tests/test_pretrained_weights.py tests/test_task_hf_causal_lm.py "
    "tests/test_data_prepare.py tests/test_data_training.py tests/test_trainer.py "
    "tests/test_fsdp.py tests/test_precision.py tests/test_cli.py tests/test_makefile.py "
    "tests/test_readme.py tests/test_doc_links.py",
    "vision-bf16-mixed-spmd": "-m 'not slow' tests/test_task_vision.py tests/test_trainer.py "
    "tests/test_strategy.py tests/test_precision.py tests/test_evaluation.py tests/test_cli.py "
    "tests/test_makefile.py tests/test_readme.py tests/test_doc_links.py",
    "v4-8-ddp-bf16-true": "-m 'not slow' tests/test_pod.py tests/test_runtime.py "
    "tests/test_strategy.py tests/test_precision.py tests/test_dockerfile.py "
    "tests/test_startup_script.py tests/test_scan.py",
}
LINT_COMBOS = ["default-lm", *SUITE_COMBOS]
CLI_COMBOS = ["default-lm", "v5litepod-32-own-names"]


def project_env(baked: Baked, **extra: str) -> dict[str, str]:
    """Environment that imports the baked package from src/ on XLA:CPU."""
    return tool_env(PYTHONPATH=str(baked.path / "src"), PJRT_DEVICE="CPU", **extra)


def run(
    command: list[str], env: dict[str, str], cwd: Path | None = None, timeout: int = 300
) -> subprocess.CompletedProcess[str]:
    """Run a command to completion, capturing its text output."""
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.suite
@pytest.mark.parametrize("combo", SUITE_COMBOS)
def test_baked_project_test_suite_passes(combo: str, bake_combo: Callable[[str], Baked]) -> None:
    """It passes the baked project's own test suite on XLA:CPU."""
    baked = bake_combo(combo)
    assert baked.exit_code == 0, baked.exception
    selection = f" {SUITE_COMBOS[combo]}"
    # The project's own `make test`, pointed at this interpreter's environment.
    result = run(
        ["make", "test", f"VENV={sys.prefix}", f"PYTEST_ARGS=-q -x -p no:cacheprovider{selection}"],
        project_env(baked),
        cwd=baked.path,
        timeout=2400,
    )
    output = result.stdout + result.stderr
    summary = pytest_summary(result.stdout)
    assert result.returncode == 0, output[-5000:]
    assert summary.get("passed", 0) > 0, output[-3000:]
    problems = {word: n for word, n in summary.items() if word.startswith(("failed", "error"))}
    assert not problems, output[-5000:]


@pytest.mark.parametrize("combo", LINT_COMBOS)
def test_baked_project_make_lint_passes(combo: str, bake_combo: Callable[[str], Baked]) -> None:
    """It passes the baked project's own `make lint` (ruff, ruff format, mypy) on first bake."""
    baked = bake_combo(combo)
    result = run(
        ["make", "lint", f"VENV={sys.prefix}"], project_env(baked), cwd=baked.path, timeout=600
    )
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
