"""Run one command on every worker of a TPU pod through `gcloud compute tpus tpu-vm ssh`.

One ssh (or scp) per worker (`--worker=I`), so every output line carries its worker and
the first failing worker stops the others. Nothing here imports torch_xla.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from .core.runtime import RuntimeConfigError, topology

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
STOP_GRACE_SECONDS = 10.0

# Shell run on the workers, shipped as package data: pod_kill.sh frees the TPU, pod_status.sh
# reads the startup script's marker and log. Sent as text, so workers need nothing installed.
KILL_SCRIPT = "pod_kill.sh"
STATUS_SCRIPT = "pod_status.sh"
# gcloud creates its ssh key on first use; parallel first uses race to create the same file.
GCLOUD_SSH_KEY = Path("~/.ssh/google_compute_engine")


def shell_script(name: str) -> str:
    """The text of one of the package's shell files."""
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


class PodError(ValueError):
    """Bad input or setup for a pod command; the message says what to do."""


@dataclass(frozen=True)
class Target:
    """A TPU VM (or pod slice) and the gcloud that reaches it."""

    name: str
    zone: str
    project: str = ""
    gcloud: tuple[str, ...] = ("gcloud",)

    def _base(self, verb: str) -> list[str]:
        scope = ["--zone", self.zone, *(["--project", self.project] if self.project else [])]
        return [*self.gcloud, "compute", "tpus", "tpu-vm", verb, self.name, *scope]

    def ssh(self, worker: int | str, command: str) -> list[str]:
        return [*self._base("ssh"), f"--worker={worker}", "--command", command]

    def scp(self, worker: int | str, sources: Sequence[str], destination: str) -> list[str]:
        scope = ["--zone", self.zone, *(["--project", self.project] if self.project else [])]
        base = [*self.gcloud, "compute", "tpus", "tpu-vm", "scp", "--recurse", *sources]
        return [*base, f"{self.name}:{destination}", *scope, f"--worker={worker}"]

    def describe(self) -> list[str]:
        return [*self._base("describe"), "--format=json"]


def make_target(name: str | None, zone: str, project: str, gcloud: str) -> Target:
    """Validate the launcher's settings into a Target."""
    if not name:
        raise PodError("no TPU name: pass --tpu NAME (make: TPU_NAME=...)")
    if not zone:
        raise PodError("no zone: pass --zone ZONE (make: ZONE=...)")
    command = tuple(shlex.split(gcloud))
    if not command:
        raise PodError("empty gcloud command: pass --gcloud or set GCLOUD")
    return Target(name=name, zone=zone, project=project, gcloud=command)


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
    package: str, python: str, accelerator: str, devices: str, args: Sequence[str]
) -> str:
    """The training command every worker runs from the synced project directory."""
    argv = [python, "-m", package, "train", "--accelerator", accelerator, "--devices", devices]
    return "PYTHONPATH=src " + shlex.join([*argv, *args])


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


def install_command(python: str) -> str:
    """Install the synced project's dependencies into the workers' Python."""
    pip = shlex.join([python, "-m", "pip", "install", "--quiet", "."])
    folder = shlex.quote(os.path.dirname(python) or ".")
    return f"if [ -w {folder} ]; then {pip}; else sudo -n {pip}; fi"


def worker_count(
    target: Target,
    accelerator_type: str = "",
    describe: Callable[[list[str]], subprocess.CompletedProcess[str]] | None = None,
) -> int:
    """Workers of the TPU from `describe` (networkEndpoints), else from the accelerator type."""
    run = describe or (
        lambda argv: subprocess.run(argv, capture_output=True, text=True, check=False)
    )
    try:
        result = run(target.describe())
    except OSError as error:
        result = subprocess.CompletedProcess([], 127, "", str(error))
    if result.returncode == 0:
        try:
            endpoints = json.loads(result.stdout).get("networkEndpoints", [])
        except (json.JSONDecodeError, AttributeError):
            endpoints = []
        if endpoints:
            return len(endpoints)
    if accelerator_type:
        try:
            return topology(accelerator_type).hosts
        except RuntimeConfigError as error:
            raise PodError(str(error)) from None
    lines = result.stderr.strip().splitlines()
    reason = next((line for line in lines if line.startswith("ERROR")), "no networkEndpoints")
    raise PodError(
        f"unknown worker count for TPU {target.name!r} ({reason}): "
        "pass --workers N or --accelerator-type TYPE"
    )


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


def run_on_workers(
    target: Target,
    command: str,
    workers: int,
    batch_size: int = 64,
    batch_delay: float = 1.0,
    fail_fast: bool = True,
    out: TextIO | None = None,
) -> Outcome:
    """Run `command` on every worker at once; return each worker's exit code.

    Connections open `batch_size` at a time, `batch_delay` seconds apart (ssh rate
    limits), and all stay open together: pod workers must run at the same time.
    """
    argv = functools.partial(target.ssh, command=command)
    return fan_out(target, argv, workers, batch_size, batch_delay, fail_fast, out)


def copy_to_workers(
    target: Target,
    sources: Sequence[str],
    destination: str,
    workers: int,
    batch_size: int = 64,
    out: TextIO | None = None,
) -> Outcome:
    """Copy local paths to `destination` on every worker, one `scp --worker=I` each.

    One copy per worker, as for commands: output and failures name their worker, and
    gcloud needs no ssh-agent (its `--worker=all` refuses to start when an agent runs
    without its key).
    """
    argv = functools.partial(target.scp, sources=sources, destination=destination)
    return fan_out(target, argv, workers, batch_size, 1.0, True, out)


def ensure_ssh_key(target: Target) -> None:
    """Let gcloud create its ssh key with one connection before connections go out at once.

    On its first use gcloud generates `~/.ssh/google_compute_engine`; several first
    uses at the same time each try to create it, and all but one fail. A failure of
    this first connection is left to the real ones to report.
    """
    if GCLOUD_SSH_KEY.expanduser().exists():
        return
    print(f"pod: creating gcloud's ssh key ({GCLOUD_SSH_KEY}) through worker 0", file=sys.stderr)
    try:
        subprocess.run(
            target.ssh(0, "true"), stdin=subprocess.DEVNULL, capture_output=True, check=False
        )
    except OSError as error:
        raise PodError(
            f"cannot run {target.gcloud[0]!r} ({error.strerror}): install the gcloud CLI"
        ) from None


def fan_out(
    target: Target,
    argv: Callable[[int], list[str]],
    workers: int,
    batch_size: int = 64,
    batch_delay: float = 1.0,
    fail_fast: bool = True,
    out: TextIO | None = None,
) -> Outcome:
    """Run `argv(worker)` for every worker at once, prefixing each output line."""
    if workers < 1 or batch_size < 1:
        raise PodError("--workers and --batch-size must be positive")
    if workers > 1:
        ensure_ssh_key(target)
    stream = out or sys.stdout
    lock = threading.Lock()
    finished: queue.Queue[tuple[int, int]] = queue.Queue()
    procs: dict[int, subprocess.Popen[str]] = {}
    readers: list[threading.Thread] = []

    def relay(worker: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with lock:
                stream.write(f"[worker {worker}] {line.rstrip()}\n")
                stream.flush()

    def watch(worker: int, proc: subprocess.Popen[str]) -> None:
        # Apart from the output: a finished worker may leave a child holding its pipe.
        finished.put((worker, proc.wait()))

    codes: dict[int, int] = {}
    failed = False
    try:
        for start in range(0, workers, batch_size):
            if start and batch_delay:
                time.sleep(batch_delay)
            failed = failed or _drain(finished, codes, fail_fast)
            if failed:
                break
            for worker in range(start, min(start + batch_size, workers)):
                procs[worker] = proc = _spawn(argv(worker))
                readers.append(threading.Thread(target=relay, args=(worker, proc), daemon=True))
                readers[-1].start()
                threading.Thread(target=watch, args=(worker, proc), daemon=True).start()
        while len(codes) < len(procs) and not failed:
            worker, code = finished.get()
            codes[worker] = code
            failed = fail_fast and code != 0
    finally:
        running = [w for w in procs if w not in codes]
        _stop({w: procs[w] for w in running})
        for worker in running:
            codes[worker] = procs[worker].wait()
        for proc in procs.values():
            _signal_group(proc, signal.SIGKILL)  # leftovers of finished workers
        for reader in readers:
            reader.join(timeout=2)
    return Outcome(codes, tuple(running) if failed else ())


def _spawn(argv: list[str]) -> subprocess.Popen[str]:
    try:
        # Own process group: stopping a worker reaches gcloud, ssh and their children.
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    except OSError as error:
        raise PodError(
            f"cannot run {argv[0]!r} ({error.strerror}): install the gcloud CLI"
        ) from None


def _drain(finished: queue.Queue[tuple[int, int]], codes: dict[int, int], fail_fast: bool) -> bool:
    failed = False
    while not finished.empty():
        worker, code = finished.get()
        codes[worker] = code
        failed = failed or (fail_fast and code != 0)
    return failed


def _stop(procs: Mapping[int, subprocess.Popen[Any]]) -> None:
    """SIGTERM each worker's process group, then SIGKILL what is left after a grace period."""
    if not procs:
        return
    for proc in procs.values():
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for proc in procs.values():
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)


def _signal_group(proc: subprocess.Popen[Any], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


@dataclass(frozen=True)
class Outcome:
    """Each worker's exit code in finishing order, and the workers stopped after a failure."""

    codes: dict[int, int]
    stopped: tuple[int, ...] = ()

    @property
    def exit_code(self) -> int:
        """The first failure's exit code (1 for a signal), 0 if every worker succeeded."""
        code = next((c for w, c in self.codes.items() if c != 0 and w not in self.stopped), 0)
        return code if 0 <= code < 256 else 1

    def summary(self) -> str:
        failed = [(w, c) for w, c in self.codes.items() if c != 0 and w not in self.stopped]
        if not failed:
            return f"pod: {len(self.codes)}/{len(self.codes)} workers succeeded"
        line = "pod: " + ", ".join(f"worker {w} failed with exit code {c}" for w, c in failed)
        if self.stopped:
            line += f"; stopped workers {', '.join(map(str, sorted(self.stopped)))}"
        return line
