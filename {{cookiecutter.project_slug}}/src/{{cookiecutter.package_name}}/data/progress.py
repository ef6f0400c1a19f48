"""Progress of a `prepare` a person can follow: shards done of all, tokens/s, time left.

Kept by the driver from the shards' records as they arrive, whatever the engine: a bar on
a terminal, and in logs a line each twentieth of the work (or each half minute).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

LOG_EVERY = 30.0  # seconds between log lines at most


class Progress:
    """Shards done of `total`, from the records of the finished shards."""

    def __init__(self, total: int, done: int, todo_bytes: int, echo: Callable[[str], None]):
        self.total, self.done, self.fresh = total, done, 0
        self.todo_bytes, self.read_bytes, self.tokens = todo_bytes, 0, 0
        self.echo = echo
        self.started = self.logged = time.perf_counter()
        self.step = -1
        self.bar: Any = None
        if sys.stderr.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=done, desc="Shards", unit=" shards")

    def __call__(self, record: dict[str, Any], size: int) -> None:
        """One more shard finished; `size` its input bytes."""
        self.done += 1
        self.fresh += 1
        self.read_bytes += size
        self.tokens += int(record["tokens"])
        now = time.perf_counter()
        if self.bar is not None:
            self.bar.set_postfix_str(f"{self.rate:,.0f} tokens/s", refresh=False)
            self.bar.update(1)
            return
        step = self.done * 20 // self.total
        if step != self.step or now - self.logged >= LOG_EVERY or self.done == self.total:
            self.step, self.logged = step, now
            self.echo(self.line())

    @property
    def rate(self) -> float:
        return self.tokens / max(1e-9, time.perf_counter() - self.started)

    def line(self) -> str:
        elapsed = time.perf_counter() - self.started
        left = self.todo_bytes - self.read_bytes
        eta = elapsed / self.read_bytes * left if self.read_bytes else 0.0
        return (
            f"shards {self.done}/{self.total}, {self.tokens:,} tokens, {self.rate:,.0f} "
            f"tokens/s, ETA {time.strftime('%H:%M:%S', time.gmtime(eta))}"
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
