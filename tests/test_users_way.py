"""A bake's own `make install && make test`, run the way its README tells a user: in the
bake's own `.venv`, made by the bake's Makefile from the machine's Python, from a shell
where no environment is activated and nothing of the template's environment is on PATH."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from docker_engine import host_index_url
from helpers import Baked, pytest_summary
from users_shell import WHOLE_SUITE_TIMEOUT, run, users_shell, with_python

# Per run: the Python it bakes for, the combination baked, the tests its run selects, and
# whether torch comes through TORCH_INDEX_URL (here the host's own index: PyTorch's CPU index
# is out of this machine's reach). `make test` runs the default bake's quick tier (every test
# file, the multi-run end-to-end trainings aside); `make test-full` its whole suite;
# `make test-pythons` the quick tier of bakes for the other two Pythons.
USERS_WAY = {
    "3.11-quick": ("3.11", "default-lm", "not slow", False),
    "3.11-whole": ("3.11", "default-lm", "", False),
    "3.10": ("3.10", "v2-8-legacy-runtime-py310", "not slow", False),
    "3.12": ("3.12", "v6e-8-vision-py312", "not slow", True),
}
MARKS = {"3.11-quick": pytest.mark.suite, "3.11-whole": pytest.mark.full}
# What the tests of a bake call by name: on PATH only through the bake's own environment.
TOOLS = ("hadolint", "shellcheck", "ruff", "pre-commit")


@pytest.mark.parametrize(
    "run_id", [pytest.param(r, marks=MARKS.get(r, pytest.mark.pythons)) for r in USERS_WAY]
)
def test_bake_installs_and_passes_its_suite_from_a_plain_shell(
    run_id: str, bake_combo: Callable[[str], Baked], tmp_path: Path
) -> None:
    """It passes a bake's `make install && make test` in the bake's own venv, not activated."""
    python, combo, selection, torch_index = USERS_WAY[run_id]
    found = with_python(python, users_shell())
    if found is None:
        pytest.skip(f"python{python} is not on this machine")
    env = found
    baked = bake_combo(combo)
    assert baked.exit_code == 0, baked.exception
    assert baked.context["python_version"] == python
    project = tmp_path / baked.path.name
    shutil.copytree(baked.path, project)
    reachable = [tool for tool in TOOLS if shutil.which(tool, path=env["PATH"])]
    assert not reachable, f"the plain shell already has {reachable}: it would prove nothing"

    index = [f"TORCH_INDEX_URL={host_index_url()}"] if torch_index else []
    run(["make", "install", *index], project, env, timeout=1800)
    venv = project / ".venv"
    version = run([str(venv / "bin" / "python"), "--version"], project, env, timeout=60)
    assert version.split()[1].startswith(f"{python}."), version
    for tool in TOOLS:
        assert (venv / "bin" / tool).is_file(), f"make install did not install {tool}"

    args = "-q -p no:cacheprovider" + (f" -m '{selection}'" if selection else "")
    timeout = 2400 if selection else WHOLE_SUITE_TIMEOUT
    output = run(["make", "test", f"PYTEST_ARGS={args}"], project, env, timeout=timeout)
    counts = pytest_summary(output)
    assert counts.get("passed", 0) > 0 and not counts.get("failed"), output[-3000:]
