"""Run one command on every worker of every slice at once, through `gcloud ... tpu-vm ssh`.

One ssh (or scp) per worker (`NODE --worker=I`), so every output line carries its worker
and the first failing worker stops the others. Nothing here imports torch_xla.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ..cli_common import EXIT_PREEMPTED
from .slices import Host
from .target import PodError, Target

STOP_GRACE_SECONDS = 10.0
# Exits that stop no other worker: done, or preempted and saved (every worker of a pod stops
# at the same step and saves its shards; stopping the others would cut their saves short).
NOT_FAILURES = frozenset({0, EXIT_PREEMPTED})
# gcloud creates its ssh key on first use; parallel first uses race to create the same file.
GCLOUD_SSH_KEY = Path("~/.ssh/google_compute_engine")


def run_on_workers(
    hosts: Sequence[Host],
    command: str | Callable[[Host], str],
    batch_size: int = 64,
    batch_delay: float = 1.0,
    fail_fast: bool = True,
    out: TextIO | None = None,
) -> Outcome:
    """Run `command` (the same, or each host's own) on every host at once.

    Connections open `batch_size` at a time, `batch_delay` seconds apart (ssh rate
    limits), and all stay open together: pod workers must run at the same time.
    """

    def argv(host: Host) -> list[str]:
        line = command if isinstance(command, str) else command(host)
        return host.target.ssh(host.worker, line)

    return fan_out(hosts, argv, batch_size, batch_delay, fail_fast, out)


def copy_to_workers(
    hosts: Sequence[Host],
    sources: Sequence[str],
    destination: str,
    batch_size: int = 64,
    out: TextIO | None = None,
) -> Outcome:
    """Copy local paths to `destination` on every host, one `scp --worker=I` each.

    One copy per worker, as for commands: output and failures name their worker, and
    gcloud needs no ssh-agent (its `--worker=all` refuses to start when an agent runs
    without its key).
    """

    def argv(host: Host) -> list[str]:
        return host.target.scp(host.worker, sources, destination)

    return fan_out(hosts, argv, batch_size, 1.0, True, out)


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
    hosts: Sequence[Host],
    argv: Callable[[Host], list[str]],
    batch_size: int = 64,
    batch_delay: float = 1.0,
    fail_fast: bool = True,
    out: TextIO | None = None,
) -> Outcome:
    """Run `argv(host)` for every host at once, prefixing each output line with its label."""
    if not hosts or batch_size < 1:
        raise PodError("--workers and --batch-size must be positive")
    if len(hosts) > 1:
        ensure_ssh_key(hosts[0].target)
    labels = tuple(host.label for host in hosts)
    stream = out or sys.stdout
    lock = threading.Lock()
    finished: queue.Queue[tuple[int, int]] = queue.Queue()
    procs: dict[int, subprocess.Popen[str]] = {}
    readers: list[threading.Thread] = []

    def relay(index: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with lock:
                stream.write(f"[{labels[index]}] {line.rstrip()}\n")
                stream.flush()

    def watch(index: int, proc: subprocess.Popen[str]) -> None:
        # Apart from the output: a finished worker may leave a child holding its pipe.
        finished.put((index, proc.wait()))

    codes: dict[int, int] = {}
    failed = False
    try:
        for start in range(0, len(hosts), batch_size):
            if start and batch_delay:
                time.sleep(batch_delay)
            failed = failed or _drain(finished, codes, fail_fast)
            if failed:
                break
            for index in range(start, min(start + batch_size, len(hosts))):
                procs[index] = proc = _spawn(argv(hosts[index]))
                readers.append(threading.Thread(target=relay, args=(index, proc), daemon=True))
                readers[-1].start()
                threading.Thread(target=watch, args=(index, proc), daemon=True).start()
        while len(codes) < len(procs) and not failed:
            index, code = finished.get()
            codes[index] = code
            failed = fail_fast and code not in NOT_FAILURES
    finally:
        running = [i for i in procs if i not in codes]
        _stop({i: procs[i] for i in running})
        for index in running:
            codes[index] = procs[index].wait()
        for proc in procs.values():
            _signal_group(proc, signal.SIGKILL)  # leftovers of finished workers
        for reader in readers:
            reader.join(timeout=2)
    return Outcome(codes, tuple(running) if failed else (), labels)


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
        failed = failed or (fail_fast and code not in NOT_FAILURES)
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
    """Each host's exit code in finishing order (by host index), and those stopped after a
    failure; `labels` names the hosts (`worker 2`, `slice 1 worker 0`)."""

    codes: dict[int, int]
    stopped: tuple[int, ...] = ()
    labels: tuple[str, ...] = ()

    def _label(self, index: int) -> str:
        return self.labels[index] if index < len(self.labels) else f"worker {index}"

    @property
    def exit_code(self) -> int:
        """The first failure's exit code (1 for a signal), 0 if every worker succeeded."""
        code = next((c for w, c in self.codes.items() if c != 0 and w not in self.stopped), 0)
        return code if 0 <= code < 256 else 1

    def summary(self) -> str:
        failed = [(w, c) for w, c in self.codes.items() if c != 0 and w not in self.stopped]
        if not failed:
            return f"pod: {len(self.codes)}/{len(self.codes)} workers succeeded"
        line = "pod: " + ", ".join(f"{self._label(w)} failed with exit code {c}" for w, c in failed)
        stopped = [self._label(index) for index in sorted(self.stopped)]
        if stopped and all(label.startswith("worker ") for label in stopped):
            line += f"; stopped workers {', '.join(label[7:] for label in stopped)}"
        elif stopped:
            line += f"; stopped {', '.join(stopped)}"
        return line
