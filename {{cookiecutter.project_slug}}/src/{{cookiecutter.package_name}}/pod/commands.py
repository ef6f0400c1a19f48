"""The shell lines the workers run: environment, training, docker, and the shipped snippets."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources

from .target import PodError, Target

FORWARDED_PREFIXES = ("XLA_", "PJRT_", "TPU_", "LIBTPU_")
# Describe one host, or are the launcher's own settings: never copied to other workers.
NOT_FORWARDED = frozenset(
    {
        "PJRT_DEVICE",
        "TPU_WORKER_ID",
        "TPU_WORKER_HOSTNAMES",
        "TPU_VISIBLE_CHIPS",
        "TPU_PROCESS_BOUNDS",
        "TPU_CHIPS_PER_PROCESS_BOUNDS",
        "TPU_PROCESS_ADDRESSES",
        "TPU_PROCESS_PORT",
        "TPU_NAME",
    }
)
# What xla_dist's docker options used to add: the TPU devices, the pod's network, big shm.
# root inside the container: the TPU device files on the VM are root-only.
DOCKER_RUN_FLAGS = ("--rm", "--privileged", "--net=host", "--shm-size=16G", "--user=root")
DEVICE_PATTERNS = ("/dev/accel*", "/dev/vfio/*")
LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"

# Shell run on the workers, shipped as package data: kill.sh frees the TPU, status.sh
# reads the startup script's marker and log. Sent as text, so workers need nothing installed.
KILL_SCRIPT = "kill.sh"
STATUS_SCRIPT = "status.sh"


def shell_script(name: str) -> str:
    """The text of one of the launcher's shell files."""
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def parse_env_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """Parse `KEY=VALUE` items from the command line."""
    parsed: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise PodError(f"--env {pair!r} must look like KEY=VALUE")
        parsed[key] = value
    return parsed


def forwarded_env(
    environ: Mapping[str, str], accelerator: str = "tpu", extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The remote environment: local XLA/PJRT/TPU/LIBTPU settings < PJRT_DEVICE < --env."""
    env = {
        key: value
        for key, value in sorted(environ.items())
        if key.startswith(FORWARDED_PREFIXES) and key not in NOT_FORWARDED
    }
    env["PJRT_DEVICE"] = accelerator.upper()
    env.update(extra or {})
    return env


def remote_command(command: str, env: Mapping[str, str], cwd: str | None = None) -> str:
    """A shell line for one worker: export the environment, change directory, run."""
    parts = []
    if env:
        parts.append("export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()))
    if cwd:
        parts.append(f"cd {shlex.quote(cwd)}")
    parts.append(command)
    return " && ".join(parts)


def train_command(
    package: str,
    python: str,
    accelerator: str,
    devices: str,
    args: Sequence[str],
    command: str = "train",
) -> str:
    """The training command (or `generate`, `eval`) every worker runs from the synced project
    directory."""
    argv = [python, "-m", package, command, "--accelerator", accelerator, "--devices", devices]
    return "PYTHONPATH=src " + shlex.join([*argv, *args])


def worker_train_command(
    package: str,
    python: str,
    accelerator: str,
    devices: str,
    args: Sequence[str],
    env: Mapping[str, str],
    remote_dir: str,
    command: str = "train",
) -> str:
    """The whole line a worker runs to train: `pod train` sends it over ssh to each worker,
    a SkyPilot task (`spot task`) runs it on every host of its slice."""
    line = train_command(package, python, accelerator, devices, args, command)
    return remote_command(line, env, remote_dir)


def docker_command(image: str, env: Mapping[str, str], args: Sequence[str]) -> str:
    """`docker run` of the image (whose entrypoint is the CLI) with the TPU and host network."""
    env_flags = [item for key, value in env.items() for item in ("-e", f"{key}={value}")]
    return shlex.join(["sudo", "docker", "run", *DOCKER_RUN_FLAGS, *env_flags, image, *args])


def snippet_command(snippet: str, args: Sequence[str], as_root: bool) -> str:
    """Run a snippet with `bash -c`, through passwordless sudo when not root and sudo exists."""
    call = shlex.join(["bash", "-c", snippet, "pod", *args])
    if not as_root:
        return call
    as_root_check = '[ "$(id -u)" != 0 ] && command -v sudo >/dev/null'
    return f"if {as_root_check}; then sudo -n {call}; else {call}; fi"


def kill_command(lockfile: str = LIBTPU_LOCKFILE, patterns: Sequence[str] = DEVICE_PATTERNS) -> str:
    return snippet_command(shell_script(KILL_SCRIPT), [lockfile, *patterns], as_root=True)


def status_command(marker: str, log: str) -> str:
    return snippet_command(shell_script(STATUS_SCRIPT), [marker, log], as_root=False)


def install_command(python: str, extras: Sequence[str] = ()) -> str:
    """Install the synced project (with `extras`) and its dependencies into the workers' Python."""
    project = f".[{','.join(extras)}]" if extras else "."
    pip = shlex.join([python, "-m", "pip", "install", "--quiet", project])
    folder = shlex.quote(os.path.dirname(python) or ".")
    return f"if [ -w {folder} ]; then {pip}; else sudo -n {pip}; fi"


def xla_dist_command(
    target: Target, command: Sequence[str], env: Mapping[str, str], image: str = ""
) -> list[str]:
    """The legacy launcher (torch_xla <= 2.0 images): xla_dist starts every worker itself."""
    argv = [sys.executable, "-m", "torch_xla.distributed.xla_dist", f"--tpu={target.name}"]
    argv += [f"--env={key}={value}" for key, value in env.items()]
    if image:
        argv.append(f"--docker-image={image}")
        argv += [f"--docker-run-flag={flag}" for flag in DOCKER_RUN_FLAGS]
    return [*argv, "--", *command]
