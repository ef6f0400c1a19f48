"""Fixtures every suite shares: fresh interpreters for runs, the environment restored, and
the gated copy of the package (a pytest plugin: conftest.py names it)."""

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

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
    argv: list[str],
    env: dict[str, str] | None = None,
    unset: tuple[str, ...] = (),
    base: dict[str, str] | None = None,
    timeout: int = SUBPROCESS_TIMEOUT,
) -> dict[str, Any]:
    """Run `python *argv` in a fresh interpreter and return the JSON object it prints last.

    Settings a runtime reads once (SPMD, device count, legacy bf16), runs that start
    processes of their own, and runs that compile need a process of their own; this is it.
    `base` is set over this process's environment, `env` over that.
    """
    child_env = {**os.environ, **(base or {}), **(env or {})}
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
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"subprocess exited with {result.returncode}:\n{result.stderr[-3000:]}")
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if not lines:
        pytest.fail(f"subprocess printed no JSON result:\n{result.stdout[-2000:]}")
    return dict(json.loads(lines[-1]))


@pytest.fixture(scope="session")
def child_environ() -> dict[str, str]:
    """What every fresh interpreter's environment sets over this one's (a suite's conftest
    names what its runtime must see there)."""
    return {}


@pytest.fixture(scope="session")
def python_subprocess(child_environ: dict[str, str]) -> RunPython:
    """Runs code in a fresh interpreter (see `run_python`)."""

    def run(
        argv: list[str],
        env: dict[str, str] | None = None,
        unset: tuple[str, ...] = (),
        timeout: int = SUBPROCESS_TIMEOUT,
    ) -> dict[str, Any]:
        return run_python(argv, env, unset, base=child_environ, timeout=timeout)

    return run


@pytest.fixture(scope="session")
def gated_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the package with the task `gated` (tests/gated_task.py), for runs that a
    test stops at a gate of its own (tests/gates.py)."""
    from training_helpers import gated_source

    return gated_source(tmp_path_factory.mktemp("gated"))
