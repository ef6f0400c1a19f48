"""The local engine's worker processes: each started fresh, fed one shard at a time.

A worker is a new interpreter (multiprocessing's `spawn`), never a fork of the driver: a
fork copies a process's locks without the threads that hold them (torch's, gcsfs's event
loop, the read-ahead), and a forked pool whose worker dies holding the queue's lock waits
forever. Each worker has a pipe of its own and no lock shared with the others, and the
driver waits on its pipe and on its process at once: a worker that dies is seen at once,
and named by the shard it held.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing import connection, get_context
from typing import Any

from .manifest import DataError
from .plan import Shard
from .shards import Job, ShardFailed, first_line, run_shard

SPAWN = get_context("spawn")
DONE, BAD_DATA, FAILED = "done", "bad data", "failed"
EXIT_SECONDS = 30.0  # an idle worker told to stop gets this long to exit, then is killed


def serve(job: Job, pipe: Any) -> None:
    """A worker: prepare each shard the pipe brings, answer with its record or its error."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the driver, which stops us
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked while starting
    while True:
        try:
            shard = pipe.recv()
        except EOFError:  # the driver is done, or gone
            return
        try:
            pipe.send((DONE, run_shard(job, shard)))
        except DataError as error:
            pipe.send((BAD_DATA, str(error)))
        except Exception as error:
            pipe.send((FAILED, f"{shard.describe()} failed: {first_line(error)}"))


class Worker:
    """One worker process, its end of the pipe, and the shard it holds."""

    def __init__(self, job: Job) -> None:
        self.pipe, theirs = SPAWN.Pipe()
        self.process = SPAWN.Process(target=serve, args=(job, theirs), daemon=True)
        self.process.start()
        theirs.close()
        self.shard: Shard | None = None

    def give(self, shard: Shard) -> None:
        self.shard = shard
        with contextlib.suppress(OSError):  # it died: `answer` says so, naming this shard
            self.pipe.send(shard)

    def answer(self) -> dict[str, Any]:
        """The record of the shard it held; its error, or its death, as the shard's."""
        assert self.shard is not None
        shard, self.shard = self.shard, None
        try:
            kind, value = self.pipe.recv()
        except (EOFError, OSError):
            self.process.join()
            raise ShardFailed(
                f"{shard.describe()} failed: its worker process died ({_death(self.process)})"
            ) from None
        if kind == BAD_DATA:
            raise DataError(value)
        if kind == FAILED:
            raise ShardFailed(value)
        return dict(value)

    def stop(self) -> None:
        self.pipe.close()  # an idle worker reads the end of the pipe and returns
        if self.shard is not None:  # a busy one is stopped: its shard is left for a rerun
            self.process.kill()
        self.process.join(EXIT_SECONDS)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def run_workers(job: Job, shards: list[Shard], workers: int,
                done: Callable[[dict[str, Any]], None]) -> None:  # fmt: skip
    """Run the shards on `workers` processes (at most one per shard), in plan order."""
    waiting = list(shards)
    crew: list[Worker] = []
    try:
        with _quiet_start():
            for _ in range(min(workers, len(shards))):
                crew.append(Worker(job))
        for worker in crew:
            worker.give(waiting.pop(0))
        while busy := [w for w in crew if w.shard is not None]:
            ready = connection.wait([w.pipe for w in busy] + [w.process.sentinel for w in busy])
            for worker in busy:
                if worker.pipe in ready or worker.process.sentinel in ready:
                    done(worker.answer())
                    if waiting:
                        worker.give(waiting.pop(0))
    finally:
        for worker in crew:
            worker.stop()


@contextmanager
def _quiet_start() -> Iterator[None]:
    """Start workers without the caller's `__main__` and with Ctrl-C held back.

    Spawn runs the main module again in each worker unless it is a package's `__main__`
    (`python -m`): a script that calls `prepare` with no `if __name__ == "__main__"` guard
    would prepare again in every worker. The workers need this package alone, so they are
    started as if there were no main module. SIGINT stays blocked in them until `serve`
    ignores it: a Ctrl-C while they start stops the driver, not them with a traceback each.
    """
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        sys.modules["__main__"] = main
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _death(process: Any) -> str:
    code = process.exitcode
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"
