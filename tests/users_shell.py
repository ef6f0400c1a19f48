"""The user's shell: this machine's environment as a fresh shell has it, a given Python in
it, and commands run to their end there (the bakes installed and tested the user's way)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import Baked

# Seconds a bake's whole `make test` may take: serial, its slow end-to-end trainings
# included, beside another of these runs on two cores.
WHOLE_SUITE_TIMEOUT = 7200


def users_shell() -> dict[str, str]:
    """This machine's environment as a fresh shell has it: no venv active, none on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PJRT_"))}
    # Nor a make above it (the template's `make test`): its variables make the bake's
    # make print directories after pytest's summary.
    for name in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CPU_NUM_DEVICES",
                 "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"):  # fmt: skip
        env.pop(name, None)
    env["PATH"] = os.pathsep.join(
        entry
        for entry in env.get("PATH", "/usr/bin:/bin").split(os.pathsep)
        if entry and not Path(entry).resolve().is_relative_to(Path(sys.prefix).resolve())
    )
    return env


def with_python(python: str, env: dict[str, str]) -> dict[str, str] | None:
    """`env` in which `python3.X` runs: as it is, or with pyenv's version of it selected
    (`pyenv shell 3.X.Y`: its shims exist for every installed version but run only the
    selected ones); None where the machine has no such Python."""
    command = f"python{python}"

    def runs(candidate: dict[str, str]) -> bool:
        if shutil.which(command, path=candidate["PATH"]) is None:
            return False
        done = subprocess.run([command, "--version"], env=candidate, capture_output=True)
        return done.returncode == 0

    if runs(env):
        return env
    if shutil.which("pyenv", path=env["PATH"]) is None:
        return None
    listed = subprocess.run(
        ["pyenv", "versions", "--bare"], env=env, capture_output=True, text=True, check=False
    ).stdout.split()
    found = [v for v in listed if re.fullmatch(rf"{re.escape(python)}\.\d+", v)]
    if not found:
        return None
    selected = {**env, "PYENV_VERSION": found[-1]}
    return selected if runs(selected) else None


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: float) -> str:
    """Run a command; its standard output, or a failure with its last output lines."""
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        output = done.stdout + done.stderr
        pytest.fail(f"{' '.join(command)} exited {done.returncode}:\n{output[-6000:]}")
    return done.stdout


@dataclass(frozen=True)
class InstalledBake:
    """A bake after its own `make install`, in the user's shell."""

    project: Path
    env: dict[str, str]

    @property
    def python(self) -> Path:
        return self.project / ".venv" / "bin" / "python"


def install_the_users_way(
    bake_combo: Callable[[str], Baked], combo: str, folder: Path, python: str = "3.11"
) -> InstalledBake:
    """Copy a bake into `folder` and run its `make install` from the user's shell."""
    env = with_python(python, users_shell())
    if env is None:
        pytest.skip(f"python{python} is not on this machine")
    baked = bake_combo(combo)
    assert baked.exit_code == 0, baked.exception
    project = folder / baked.path.name
    shutil.copytree(baked.path, project)
    run(["make", "install"], project, env, timeout=1800)
    return InstalledBake(project, env)


def install_once_the_users_way(
    bake_combo: Callable[[str], Baked], combo: str, factory: pytest.TempPathFactory
) -> InstalledBake:
    """`install_the_users_way` done once for the whole session, by whichever pytest-xdist
    worker asks first: the others wait for it and share the installed project (a venv of
    torch is gigabytes and minutes). Its users read it; none writes into it but its own
    `make test`."""
    from filelock import FileLock

    base = factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = root / f"installed-{combo}"
    with FileLock(f"{folder}.lock"):
        marker = folder / "installed.json"
        if marker.exists():
            env = with_python("3.11", users_shell())
            assert env is not None
            return InstalledBake(Path(json.loads(marker.read_text())["project"]), env)
        shutil.rmtree(folder, ignore_errors=True)  # a failed attempt's remains
        folder.mkdir()
        installed = install_the_users_way(bake_combo, combo, folder)
        marker.write_text(json.dumps({"project": str(installed.project)}))
        return installed
