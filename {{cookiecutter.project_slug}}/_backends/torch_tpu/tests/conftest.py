"""Shared fixtures: fresh interpreters for runs, a GCS emulator, the environment restored."""

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Fixtures `gcs_emulator` and `gcs_bucket`: a local GCS server for `gs://` checkpoints.
pytest_plugins = ["gcs_emulator"]

SUBPROCESS_TIMEOUT = 300

RunPython = Callable[..., dict[str, Any]]


def _source_root() -> Path:
    """The directory the package imports from, so fresh interpreters find it uninstalled."""
    import {{ cookiecutter.package_name }}

    return Path({{ cookiecutter.package_name }}.__file__).resolve().parents[1]


@pytest.fixture
def restore_environ() -> Iterator[None]:
    """Undo every environment change a test (or the code under test) makes."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def run_python(
    argv: list[str], env: dict[str, str] | None = None, unset: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Run `python *argv` in a fresh interpreter and return the JSON object it prints last.

    A run that starts processes of its own, or compiles, gets a process of its own.
    """
    child_env = {**os.environ, **(env or {})}
    for name in unset:
        child_env.pop(name, None)
    child_env["PYTHONPATH"] = os.pathsep.join(
        [str(_source_root()), *filter(None, [child_env.get("PYTHONPATH")])]
    )
    result = subprocess.run(
        [sys.executable, *argv],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"subprocess exited with {result.returncode}:\n{result.stderr[-3000:]}")
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if not lines:
        pytest.fail(f"subprocess printed no JSON result:\n{result.stdout[-2000:]}")
    return dict(json.loads(lines[-1]))


@pytest.fixture(scope="session")
def python_subprocess() -> RunPython:
    """Runs code in a fresh interpreter (see `run_python`)."""
    return run_python


@pytest.fixture(scope="session")
def gated_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the package with the task `gated` (tests/gated_task.py), for runs that a
    test stops at a gate of its own (tests/gates.py)."""
    from training_helpers import gated_source

    return gated_source(tmp_path_factory.mktemp("gated"))
