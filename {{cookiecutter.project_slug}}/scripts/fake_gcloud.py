"""A stand-in for `gcloud compute tpus` that runs every TPU worker on this machine.

Rehearses pod launches without Google Cloud (`make pod-rehearse`, the pod tests):
  python scripts/fake_gcloud.py compute tpus tpu-vm ssh NAME --zone Z --worker=all --command CMD
Worker I runs `bash -c CMD` in $FAKE_GCLOUD_ROOT/worker-I with TPU_WORKER_ID=I and a
login-like environment (like ssh, nothing of the caller's environment leaks through).
FAKE_GCLOUD_WORKERS sets the worker count (default 4). Also: tpu-vm scp, describe,
create, delete, and queued-resources create and delete.

FAKE_GCLOUD_SLICES=N (N > 1) stands in for a multislice: the nodes NAME-0 ... NAME-(N-1)
of one queued resource, each with FAKE_GCLOUD_WORKERS workers in
$FAKE_GCLOUD_ROOT/NAME-S/worker-I, their addresses 10.0.S.(I+2) in `describe`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

# What an ssh login on a worker has; everything else must be sent with the command.
LOGIN_VARIABLES = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "SHELL", "TMPDIR")
VALUE_FLAGS = {
    "--zone",
    "--project",
    "--worker",
    "--command",
    "--format",
    "--accelerator-type",
    "--version",
    "--runtime-version",
    "--node-id",
    "--node-count",
    "--node-prefix",
    "--metadata-from-file",
    "--batch-size",
}


def root() -> Path:
    default = Path(tempfile.gettempdir()) / "fake-gcloud"
    return Path(os.environ.get("FAKE_GCLOUD_ROOT", default))


def worker_count() -> int:
    return int(os.environ.get("FAKE_GCLOUD_WORKERS", "4"))


def slice_count() -> int:
    return int(os.environ.get("FAKE_GCLOUD_SLICES", "1"))


def slice_of(node: str) -> int:
    """The slice a node stands for: S of NAME-S when there are several, else 0."""
    found = re.fullmatch(r".*-([0-9]+)", node)
    if slice_count() == 1:
        return 0
    if not found or int(found.group(1)) >= slice_count():
        raise SystemExit(f"ERROR: (gcloud) NOT_FOUND: no node {node} among the slices")
    return int(found.group(1))


def worker_dir(worker: int, node: str = "") -> Path:
    """A worker's folder: worker-I, or NODE/worker-I when there are several slices."""
    base = root() / node if slice_count() > 1 else root()
    path = base / f"worker-{worker}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def parse(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """Split arguments into positionals and `--flag value` / `--flag=value` options."""
    positional: list[str] = []
    options: dict[str, str] = {}
    items = iter(argv)
    for item in items:
        if item.startswith("--"):
            name, sep, value = item.partition("=")
            if not sep:
                value = next(items, "") if name in VALUE_FLAGS else "true"
            options[name] = value
        else:
            positional.append(item)
    return positional, options


def selected_workers(spec: str) -> list[int]:
    if spec in ("", "all"):
        return list(range(worker_count()))
    workers = [int(part) for part in spec.split(",")]
    if any(not 0 <= worker < worker_count() for worker in workers):
        raise SystemExit(f"ERROR: (gcloud) worker {spec} out of range 0-{worker_count() - 1}")
    return workers


def ssh(node: str, options: dict[str, str]) -> int:
    """Run the command on each selected worker, all at once; the worst exit code wins."""
    command = options.get("--command")
    if command is None:
        raise SystemExit("ERROR: (gcloud) this stand-in needs --command")
    procs = []
    for worker in selected_workers(options.get("--worker", "")):
        env = {k: os.environ[k] for k in LOGIN_VARIABLES if k in os.environ}
        env["TPU_WORKER_ID"] = str(worker)
        folder = worker_dir(worker, node)
        procs.append(subprocess.Popen(["bash", "-c", command], cwd=folder, env=env))

    def stop(signum: int, _frame: object) -> None:
        # A dropped ssh connection takes the remote command with it.
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)
        raise SystemExit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    codes = [proc.wait() for proc in procs]
    return max((code if code >= 0 else 128 - code for code in codes), default=0)


def scp(positional: list[str], options: dict[str, str]) -> int:
    """Copy local paths to `NAME:DEST` on each selected worker (DEST relative to its home)."""
    *sources, destination = positional
    node, _, remote = destination.partition(":")
    slice_of(node)
    for worker in selected_workers(options.get("--worker", "")):
        target = worker_dir(worker, node) / remote
        for source in map(Path, sources):
            into = target / source.name if remote.endswith("/") or target.is_dir() else target
            if source.is_dir():
                shutil.copytree(source, into, dirs_exist_ok=True)
            else:
                into.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, into)
    return 0


def describe(name: str, options: dict[str, str]) -> int:
    index = slice_of(name)
    endpoints = [
        {"ipAddress": f"10.0.{index}.{i + 2}", "port": 8470} for i in range(worker_count())
    ]
    state = {"name": name, "state": "READY", "networkEndpoints": endpoints}
    print(json.dumps(state, indent=2))
    return 0


def main(argv: list[str]) -> int:
    positional, options = parse(argv)
    if positional[:2] != ["compute", "tpus"] or len(positional) < 5:
        print(f"ERROR: (gcloud) not supported by this stand-in: {' '.join(argv)}", file=sys.stderr)
        return 2
    group, verb, name = positional[2], positional[3], positional[4]
    if (group, verb) == ("tpu-vm", "ssh"):
        slice_of(name)
        return ssh(name, options)
    if (group, verb) == ("tpu-vm", "scp"):
        return scp(positional[4:], options)
    if (group, verb) == ("tpu-vm", "describe"):
        return describe(name, options)
    if verb in ("create", "delete") and group in ("tpu-vm", "queued-resources"):
        count = int(options.get("--node-count", "1"))
        prefix = options.get("--node-prefix", name)
        names = [f"{prefix}-{index}" for index in range(count)] if count > 1 else [name]
        for node in names:
            for worker in range(worker_count()):
                worker_dir(worker, node)
        print(f"{verb}: {group} {' '.join(names)} ({worker_count()} workers each under {root()})")
        return 0
    print(f"ERROR: (gcloud) not supported by this stand-in: {group} {verb}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
