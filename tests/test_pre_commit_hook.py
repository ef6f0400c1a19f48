"""In a baked project made a git repository, `make install` installs the pre-commit hook,
and `git commit` from a shell without the virtual environment runs the hooks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from helpers import Baked, tool_env

VENV_BIN = Path(sys.prefix) / "bin"
COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "__pycache__", ".*_cache")


def plain_shell_env(home: Path) -> dict[str, str]:
    """A login-like environment whose PATH does not reach the virtual environment."""
    path = os.pathsep.join(
        entry
        for entry in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
        if entry and Path(entry).resolve() != VENV_BIN.resolve()
    )
    identity = {"NAME": "t", "EMAIL": "t@example.com"}
    env = {"PATH": path, "HOME": str(home), "LANG": "C.UTF-8"}
    for role in ("AUTHOR", "COMMITTER"):
        env.update({f"GIT_{role}_{key}": value for key, value in identity.items()})
    return env


def run(
    command: list[str], cwd: Path, env: dict[str, str], timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def repository(
    bake_combo: Callable[[str], Baked], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """A fresh bake, `git init`-ed, after `make install` into this test run's environment."""
    project = tmp_path_factory.mktemp("hooked") / "project"
    shutil.copytree(bake_combo("default-lm").path, project, ignore=COPY_IGNORE)
    home = project.parent / "home"
    home.mkdir()
    assert run(["git", "init", "-q", "-b", "main"], project, plain_shell_env(home)).returncode == 0
    try:
        installed = run(
            ["make", "install", f"VENV={sys.prefix}"], project, tool_env(HOME=str(home))
        )
        assert installed.returncode == 0, (installed.stdout + installed.stderr)[-3000:]
        yield project
    finally:
        run(
            [sys.executable, "-m", "pip", "uninstall", "--quiet", "--yes", "tpu-project"],
            project,
            tool_env(),
        )


def hook(project: Path) -> Path:
    return project / ".git" / "hooks" / "pre-commit"


def test_make_install_installs_the_hook_in_a_git_repository(repository: Path) -> None:
    """It installs pre-commit's hook with the environment's bin first on the hook's PATH."""
    lines = hook(repository).read_text().splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    assert lines[1].startswith(f'export PATH="{VENV_BIN}:$PATH"')
    assert any(line.startswith("INSTALL_PYTHON=") for line in lines)
    assert os.access(hook(repository), os.X_OK)


def test_commit_without_the_venv_activated_runs_the_hooks(repository: Path) -> None:
    """It commits the whole project from a shell without the venv, every hook passing."""
    env = plain_shell_env(repository.parent / "home")
    assert shutil.which("check-yaml", path=env["PATH"]) is None, "the venv is on PATH"
    assert run(["git", "add", "-A"], repository, env).returncode == 0
    committed = run(["git", "commit", "-m", "First bake"], repository, env, timeout=600)
    output = committed.stdout + committed.stderr
    assert committed.returncode == 0, output
    assert "not found" not in output
    for hook_name in ("ruff check", "ruff format", "check yaml", "check toml"):
        assert any(
            line.startswith(hook_name) and line.endswith("Passed") for line in output.splitlines()
        ), output


def test_commit_of_an_unformatted_file_is_stopped(repository: Path) -> None:
    """It refuses a commit whose Python file the hooks reformat, without the venv either."""
    env = plain_shell_env(repository.parent / "home")
    (repository / "extra.py").write_text("x  =  1\n")
    assert run(["git", "add", "extra.py"], repository, env).returncode == 0
    committed = run(["git", "commit", "-m", "Unformatted"], repository, env, timeout=600)
    output = committed.stdout + committed.stderr  # git gives a hook's output to stderr
    assert committed.returncode != 0
    assert "files were modified by this hook" in output, output
    assert any(
        line.startswith("ruff format") and line.endswith("Failed") for line in output.splitlines()
    ), output
    run(["git", "reset", "-q", "--hard"], repository, env)
    (repository / "extra.py").unlink(missing_ok=True)


def test_reinstalling_the_hook_keeps_one_path_line(repository: Path) -> None:
    """It rewrites the hook on `make pre-commit-install` instead of stacking PATH lines."""
    again = run(
        ["make", "pre-commit-install", f"VENV={sys.prefix}"],
        repository,
        tool_env(HOME=str(repository.parent / "home")),
    )
    assert again.returncode == 0, again.stdout + again.stderr
    text = hook(repository).read_text()
    assert text.count("export PATH=") == 1
