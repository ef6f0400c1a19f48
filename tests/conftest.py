"""Fixtures for the template's tests: the hooks as modules, a session-wide
cache of baked combinations, and the real cookiecutter CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from helpers import BIN_DIR, COMBOS, TEMPLATE_DIR, Baked, load_hook, tool_env
from users_shell import InstalledBake, install_once_the_users_way

# cookiecutter puts the template's root on sys.path while it renders, so that
# `_extensions` (local_extensions.py) import; pytest-cookies and the tests that
# render cookiecutter.json themselves call cookiecutter's functions without it.
if str(TEMPLATE_DIR) not in sys.path:
    sys.path.insert(0, str(TEMPLATE_DIR))


@pytest.fixture(scope="session")
def pre_gen() -> ModuleType:
    """The pre-generation hook as a module."""
    return load_hook("pre_gen_project")


@pytest.fixture(scope="session")
def post_gen() -> ModuleType:
    """The post-generation hook as a module."""
    return load_hook("post_gen_project")


@pytest.fixture(scope="session")
def bake_combo(cookies_session: Any) -> Callable[[str], Baked]:
    """Bake a named combination once per session and return it."""
    cache: dict[str, Baked] = {}

    def bake(combo: str) -> Baked:
        if combo not in cache:
            result = cookies_session.bake(extra_context=COMBOS[combo], template=str(TEMPLATE_DIR))
            path = Path(result.project_path) if result.project_path else Path()
            cache[combo] = Baked(
                combo, result.context or {}, result.exit_code, result.exception, path
            )
        return cache[combo]

    return bake


@pytest.fixture(scope="session")
def torch_tpu_installed(
    bake_combo: Callable[[str], Baked], tmp_path_factory: pytest.TempPathFactory
) -> InstalledBake:
    """The torch_tpu bake after its `make install` the user's way (torch 2.13, no torch-tpu):
    its suite runs there, and its environment is the gcloud tier's TorchTPU worker image."""
    return install_once_the_users_way(bake_combo, "torch-tpu-lm", tmp_path_factory)


@pytest.fixture(scope="session")
def cookiecutter_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cookiecutter config that keeps replays and clones out of the user's home."""
    home = tmp_path_factory.mktemp("cookiecutter-home")
    config = home / "config.yaml"
    config.write_text(
        f"cookiecutters_dir: {json.dumps(str(home / 'cookiecutters'))}\n"
        f"replay_dir: {json.dumps(str(home / 'replay'))}\n",
        encoding="utf-8",
    )
    return config


@pytest.fixture(scope="session")
def run_cookiecutter(
    cookiecutter_config: Path,
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the real cookiecutter CLI against this template (with --no-input by default)."""

    def run(
        output_dir: Path,
        *args: str,
        context: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        no_input: bool = True,
        temp_dir: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        pairs = [f"{key}={value}" for key, value in (context or {}).items()]
        command = [
            str(BIN_DIR / "cookiecutter"),
            str(TEMPLATE_DIR),
            *(["--no-input"] if no_input else []),
            "--config-file",
            str(cookiecutter_config),
            "--output-dir",
            str(output_dir),
            *args,
            *pairs,
        ]
        return subprocess.run(
            command,
            cwd=cwd or output_dir,
            env=tool_env(**({"TMPDIR": str(temp_dir)} if temp_dir else {})),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    return run


# The files by how long they run, longest first (`make test`'s, then `make test-full`'s).
# pytest-xdist hands each worker a file whole, in this order (`--no-loadscope-reorder`; by
# default it starts the files of many tests first, which put the single-test bake suites of
# half an hour at the end, one after another on one worker).
# A worker takes its next file while its first runs: a short one each, so that neither holds
# a long file back behind half an hour.
LONGEST_FIRST = (
    "test_users_way.py",
    "test_users_way_torch_tpu.py",
    "test_template_repo.py",
    "test_spot_task.py",
    "test_baked_suites.py",
    "test_docker.py",
    "test_gcloud.py",
    "test_baked_project.py",
    "test_users_way_torch_tpu_hf.py",
    "test_cross_backend.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files start first: the two workers begin on the two longest and finish
    near each other."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
