"""The Docker tier: bake the default project, build its image on a real engine, run it.

Needs a Docker engine: the running one, or (as root) Debian's docker.io installed and
started here. Without one the tier skips with the reason, unless
TPU_TEMPLATE_REQUIRE_DOCKER=1 (CI), where it fails. Logs go to the pytest tmp dir.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from docker_engine import (
    CommandFailed,
    Engine,
    EngineUnavailable,
    ensure_base_image,
    ensure_engine,
    host_index_url,
    proxy_build_args,
    run_logged,
)

pytestmark = pytest.mark.docker

IMAGE = "tpu-template-test/tpu-project:latest"
PACKAGE = "tpu_project"
# --privileged is what a TPU VM uses; this kernel refuses it, and CPU runs need none
# of it, so the tier grants every capability instead (minus one the kernel refuses).
RUN_FLAGS = (
    "--rm",
    "--cap-add",
    "ALL",
    "--cap-drop",
    "SYS_RESOURCE",
    "--net=host",
    "--shm-size=2g",
    "-e",
    "PJRT_DEVICE=CPU",
)
BUILD_TIMEOUT = 2400
RUN_TIMEOUT = 600


def _fail_with_log(message: str, log: Path) -> None:
    """Fail with the message, the log's path and its last lines."""
    tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-40:])
    pytest.fail(f"{message}\nlog: {log}\n--- last lines ---\n{tail}", pytrace=False)


@pytest.fixture(scope="module")
def docker_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory every build and run log of this tier goes to."""
    logs = tmp_path_factory.mktemp("docker-logs")
    print(f"\nDocker tier logs: {logs}")
    return logs


@pytest.fixture(scope="module")
def engine(docker_logs: Path) -> Iterator[Engine]:
    """A responding Docker engine; dockerd is stopped afterwards if this tier started it."""
    try:
        found = ensure_engine(docker_logs)
    except EngineUnavailable as error:
        reason = f"no Docker engine: {error}"
        if os.environ.get("TPU_TEMPLATE_REQUIRE_DOCKER") == "1":
            pytest.fail(f"{reason} (required by TPU_TEMPLATE_REQUIRE_DOCKER=1)", pytrace=False)
        print(reason)
        pytest.skip(reason)
    if found.daemon is not None:
        print(f"started dockerd {' '.join(found.flags)} (pid {found.daemon.pid})")
    yield found
    found.stop()


def _image_id(engine: Engine, image: str) -> str | None:
    result = subprocess.run(
        [engine.docker, "image", "inspect", "--format", "{{.Id}}", image],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return result.stdout.strip() if result.returncode == 0 else None


@pytest.fixture(scope="module")
def image(
    engine: Engine,
    docker_logs: Path,
    tmp_path_factory: pytest.TempPathFactory,
    run_cookiecutter: Callable[..., subprocess.CompletedProcess[str]],
) -> str:
    """The default bake's image, built from the local base with a reachable torch index."""
    build_log = docker_logs / "build.log"
    try:
        base = ensure_base_image(engine, docker_logs, docker_logs / "base-image.log")
    except (CommandFailed, EngineUnavailable) as error:
        _fail_with_log(f"cannot make the base image: {error}", docker_logs / "base-image.log")
    out = tmp_path_factory.mktemp("docker-bake")
    baked = run_cookiecutter(out)
    assert baked.returncode == 0, baked.stderr
    previous = _image_id(engine, IMAGE)
    command = [
        engine.docker,
        "build",
        "--network",
        "host",
        "--build-arg",
        f"BASE_IMAGE={base}",
        "--build-arg",
        f"TORCH_INDEX_URL={host_index_url()}",
        *proxy_build_args(),
        "--tag",
        IMAGE,
        str(out / "tpu-project"),
    ]
    # The classic builder is in every engine from Debian's 20.10 on and needs no plugin.
    env = {**os.environ, "DOCKER_BUILDKIT": os.environ.get("DOCKER_BUILDKIT", "0")}
    try:
        run_logged(command, build_log, timeout=BUILD_TIMEOUT, env=env, stdin=subprocess.DEVNULL)
    except CommandFailed as error:
        _fail_with_log(f"docker build failed: {error}", build_log)
    current = _image_id(engine, IMAGE)
    if previous and previous != current:
        # Drop the last run's project layers; the shared torch layers stay cached.
        run_logged([engine.docker, "rmi", previous], build_log, timeout=300, check=False)
    return IMAGE


def _run(engine: Engine, log: Path, *args: str) -> tuple[int, str]:
    """Run the image with the tier's flags; log everything, return exit code and stdout."""
    command = [engine.docker, "run", *RUN_FLAGS, *args]
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired:
        log.write_text(f"$ {shlex.join(command)}\n[timed out after {RUN_TIMEOUT}s]\n")
        pytest.fail(f"docker run timed out after {RUN_TIMEOUT}s: {shlex.join(command)}")
    log.write_text(
        f"$ {shlex.join(command)}\n{result.stdout}--- stderr ---\n{result.stderr}"
        f"[exit {result.returncode}]\n",
        encoding="utf-8",
    )
    return result.returncode, result.stdout


def test_image_runs_the_cli_as_a_non_root_user(engine: Engine, image: str) -> None:
    """It runs `python -m <package>` as uid 10001, with --help and PJRT_DEVICE=TPU by default."""
    result = subprocess.run(
        [engine.docker, "image", "inspect", "--format", "{{json .Config}}", image],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    config = json.loads(result.stdout)
    assert config["User"] == "10001"
    assert config["Entrypoint"] == ["python", "-m", PACKAGE]
    assert config["Cmd"] == ["--help"]
    assert "PJRT_DEVICE=TPU" in config["Env"]


def test_container_prints_help_by_default(engine: Engine, image: str, docker_logs: Path) -> None:
    """It prints the CLI's help, listing `train`, when run without arguments."""
    log = docker_logs / "run-help.log"
    code, output = _run(engine, log, image)
    if code != 0:
        _fail_with_log(f"`docker run {image}` exited {code}", log)
    assert "Usage:" in output
    assert re.search(r"│ train\s", output), output


def test_container_trains_on_xla_cpu(engine: Engine, image: str, docker_logs: Path) -> None:
    """It trains five logged steps on XLA:CPU inside the container and evaluates."""
    log = docker_logs / "run-train.log"
    code, output = _run(
        engine,
        log,
        image,
        "train",
        "--accelerator",
        "cpu",
        "--max-steps",
        "5",
        "--log-every",
        "1",
        "--run-dir",
        "/tmp/run",
    )
    if code != 0:
        _fail_with_log(f"training in the container exited {code}", log)
    losses = [float(x) for x in re.findall(r"^step \d+/\d+ train loss=([0-9.]+)", output, re.M)]
    assert len(losses) == 5, output
    assert losses[-1] < losses[0], f"loss did not fall: {losses}"
    assert "completed: 5 steps" in output


def test_container_doctor_reports_a_healthy_xla_cpu_setup(
    engine: Engine, image: str, docker_logs: Path
) -> None:
    """Its `doctor` finds torch/torch_xla in lockstep, XLA:CPU, the container and its flags."""
    log = docker_logs / "run-doctor.log"
    code, output = _run(engine, log, image, "doctor", "--json")
    if code != 0:
        _fail_with_log(f"doctor in the container exited {code}", log)
    report = json.loads(output)
    checks = {check["name"]: check for check in report["checks"]}
    assert report["errors"] == 0, checks
    assert checks["versions"]["detail"].startswith("torch 2.9.0, torch_xla 2.9.0")
    assert checks["accelerator"]["status"] == "ok"
    assert "XLA:CPU" in checks["accelerator"]["detail"]
    assert "inside a container" in checks["container"]["detail"]
    assert checks["container-network"]["status"] == "ok", checks["container-network"]
    assert checks["shm"]["detail"].startswith("/dev/shm is 2.0 GiB")
