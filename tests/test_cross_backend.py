"""One project baked for both backends: a checkpoint of either resumes on the other."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from helpers import Baked, pytest_summary, tool_env
from users_shell import InstalledBake

# The bake's test of it: both layouts read, both directions, the RNG line, a refusal.
BAKE_TEST = "tests/test_cross_backend.py"


@pytest.mark.full
def test_each_backend_resumes_the_others_checkpoint(
    bake_combo: Callable[[str], Baked], torch_tpu_installed: InstalledBake
) -> None:
    """It runs the torch_xla bake's cross-backend test with the torch_tpu bake of the same
    project (its own venv, installed the user's way) as the other backend: none skips."""
    baked = bake_combo("default-lm")
    assert baked.exit_code == 0, baked.exception
    other = torch_tpu_installed.project
    assert other.name == baked.path.name  # the same project, the other backend
    env = tool_env(
        PYTHONPATH=str(baked.path / "src"),
        PJRT_DEVICE="CPU",
        OTHER_BACKEND_PYTHON=str(torch_tpu_installed.python),
        OTHER_BACKEND_SRC=str(other / "src"),
    )
    pytest_args = f"PYTEST_ARGS=-q -rs -p no:cacheprovider {BAKE_TEST}"
    result = subprocess.run(
        ["make", "test", f"VENV={sys.prefix}", pytest_args],
        cwd=baked.path, env=env, capture_output=True, text=True, timeout=2400, check=False,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    summary = pytest_summary(result.stdout)
    assert summary.get("passed", 0) > 0, output[-5000:]
    assert not [word for word in summary if word.startswith(("skipped", "failed", "error"))], (
        output[-5000:]
    )
