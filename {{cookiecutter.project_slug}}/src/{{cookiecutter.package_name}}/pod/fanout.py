"""Run one command on every worker at once through `gcloud compute tpus tpu-vm ssh`.

One ssh (or scp) per worker (`--worker=I`), so every output line carries its worker and
the first failing worker stops the others. Nothing here imports torch_xla.
"""

from __future__ import annotations

import contextlib
import functools
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

from .target import PodError, Target

STOP_GRACE_SECONDS = 10.0
# gcloud creates its ssh key on first use; parallel first uses race to create the same file.
GCLOUD_SSH_KEY = Path("~/.ssh/google_compute_engine")


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
