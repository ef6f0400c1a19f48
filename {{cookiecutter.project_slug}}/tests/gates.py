"""Gates a test holds shut, so that its signal reaches a process provably inside its work.

A test that interrupts a process must not race it: on a loaded machine the process may
finish before a signal sent after some line of its output arrives. Here the process blocks
on a FIFO the test controls, so it cannot finish until the test lets it go, and the test
sends its signal first. No sleep stands for synchronisation: the conditions waited for
last until the test acts.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from pathlib import Path

# Guards against a process that never reaches the gate (a failure, reported as one).
PATIENCE = 600.0
POLL = 0.01
DEVICE_GROUP = 8  # batches torch_xla's MpDeviceLoader sends to the device at once


class Gate:
    """A FIFO held open for writing: a process that reads it waits until `release()`.

    Opened O_RDWR the FIFO always has a writer, so a reader's open returns at once and its
    read blocks until the test closes its end. A reader first touches `reached` (the FIFO's
    path plus `.reached`). `release()` removes the FIFO first, so a process reaching the gate
    later (a resumed run) finds none and passes. Processes the test starts do not inherit
    the test's end (subprocess closes it in the child).
    """

    def __init__(self, path: Path, steps: int) -> None:
        """A gate for a run of the task `gated`: `steps` training steps run before it.

        torch_xla's MpDeviceLoader moves batches to the device in groups of
        DEVICE_GROUP (its device_prefetch_size): a batch held back holds its whole group, so
        the gate comes after whole groups, or the run would wait before the steps it allows.
        """
        if steps < DEVICE_GROUP or steps % DEVICE_GROUP:
            raise ValueError(f"a gate comes after a multiple of {DEVICE_GROUP} steps, not {steps}")
        self.path = path
        self.reached = path.with_name(path.name + ".reached")
        self.steps = steps
        os.mkfifo(path)
        self._end: int | None = os.open(path, os.O_RDWR)

    def wait_reached(self, process: subprocess.Popen[str], log: Path | None = None) -> None:
        """Return once `process` waits at the gate (it stays there: polling misses nothing);
        `log` holds its output when it is not piped."""
        deadline = time.monotonic() + PATIENCE
        while not self.reached.exists():
            if process.poll() is not None:
                raise _died(process, "reaching the gate", log)
            if time.monotonic() > deadline:
                process.kill()
                raise _died(process, f"reaching the gate within {PATIENCE:.0f} s", log)
            time.sleep(POLL)

    def release(self) -> None:
        """Let every waiting reader go, and every later one pass (idempotent)."""
        if self._end is None:
            return
        os.unlink(self.path)
        os.close(self._end)  # waiting readers read end-of-file
        self._end = None


def wait_for_line(process: subprocess.Popen[str], log: Path, text: str) -> None:
    """Return once `log` (the output of `process`) holds `text`: a line the process writes
    before a gate it cannot pass, so waiting for it is no race."""
    deadline = time.monotonic() + PATIENCE
    while text not in log.read_text():
        if process.poll() is not None:
            raise _died(process, f"printing {text!r}", log)
        if time.monotonic() > deadline:
            process.kill()
            raise _died(process, f"printing {text!r} within {PATIENCE:.0f} s", log)
        time.sleep(POLL)


def _died(
    process: subprocess.Popen[str], waiting_for: str, log: Path | None = None
) -> AssertionError:
    output = process.communicate()[0] if process.stdout else ""
    output = log.read_text() if log is not None else output
    return AssertionError(f"exited {process.returncode} before {waiting_for}:\n{output[-4000:]}")


def open_when_read(fifo: Path, process: subprocess.Popen[str]) -> int:
    """Open `fifo` for writing once `process` is blocked opening it for reading.

    A non-blocking open for writing fails with ENXIO while no reader has the FIFO open;
    a reader that opened it stays blocked until the test opens it, so polling cannot miss
    the moment. The returned end gives the reader nothing until the test writes to it.
    """
    deadline = time.monotonic() + PATIENCE
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as error:
            if error.errno != errno.ENXIO:
                raise
        if process.poll() is not None:
            raise _died(process, f"reading {fifo}")
        if time.monotonic() > deadline:
            process.kill()
            raise _died(process, f"reading {fifo} within {PATIENCE:.0f} s")
        time.sleep(POLL)


def _pending(pid: int, sig: signal.Signals) -> bool:
    """Whether `sig` still waits for a thread of `pid` to take it (Linux /proc)."""
    bit = 1 << (sig - 1)
    statuses = [Path(f"/proc/{pid}/status")]
    statuses += sorted(Path(f"/proc/{pid}/task").glob("*/status"))
    for status in statuses:
        try:
            lines = status.read_text().splitlines()
        except OSError:  # the process or thread is gone
            continue
        for line in lines:
            name, _, mask = line.partition(":")
            if name in ("SigPnd", "ShdPnd") and int(mask, 16) & bit:
                return True
    return False


def signal_taken(process: subprocess.Popen[str] | int, sig: signal.Signals) -> None:
    """Send `sig` to `process` (or the process with this pid) and `wait_taken`."""
    if isinstance(process, int):
        os.kill(process, sig)
    else:
        process.send_signal(sig)
    wait_taken(process, sig)


def wait_taken(process: subprocess.Popen[str] | int, sig: signal.Signals) -> None:
    """Return once `sig`, sent, is off the pending set of every thread of `process`.

    Python's C-level handler runs as that thread returns to user space, and the main thread
    runs the Python handler at its next bytecode boundary (a blocking read is interrupted
    for it, then resumed): so the handler has run before the process gets past anything
    the test releases afterwards.
    """
    if isinstance(process, int):
        pid, running = process, lambda: Path(f"/proc/{process}").exists()
    else:
        pid, running = process.pid, lambda: process.poll() is None
    if not Path("/proc/self/status").exists():
        return  # no /proc: delivery is immediate on an idle machine, the best left here
    deadline = time.monotonic() + PATIENCE
    while _pending(pid, sig) and running():
        if time.monotonic() > deadline:
            raise AssertionError(f"{sig.name} was never taken by process {pid}")
        time.sleep(POLL)


def children(pid: int) -> list[int]:
    """The processes `pid` started that still run its program (Linux /proc): a launcher's
    workers, not the helpers a library starts (W&B's wandb-core)."""
    found: list[int] = []
    for listed in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(child) for child in listed.read_text().split()]
        except OSError:  # the thread is gone
            continue
    return [child for child in found if _program(child) == _program(pid)]


def _program(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:  # gone
        return None
