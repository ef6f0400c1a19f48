"""Windows fetched ahead of the step: the sampler announces what it will hand out, a few
threads fetch it (byte ranges, a batch at a time), and the dataset takes it when asked.

`ReadAheadSampler` is the `ShardSampler` the training loop resumes (same order, same
positions: a function of seed, epoch and step); it only tells the dataset, `ahead` samples
early, which windows come next. What is fetched and not yet taken is at most `ahead`
windows: host memory stays flat whatever the dataset's size.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..core.sampling import ShardSampler

Fetch = Callable[[list[int]], list[bytes]]
THREADS = 4  # groups fetched at once (each group's ranges are fetched concurrently too)


class ReadAhead:
    """Fetches announced windows in the background; hands them out in any order asked."""

    def __init__(self, threads: int = THREADS) -> None:
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="readahead")
        self.lock = threading.Lock()
        self.pending: dict[int, deque[tuple[Future[list[bytes]], int, int]]] = {}

    def announce(self, indices: list[int], fetch: Fetch) -> None:
        future = self.pool.submit(fetch, indices)
        with self.lock:
            for place, index in enumerate(indices):
                self.pending.setdefault(index, deque()).append((future, place, len(indices)))

    def take(self, indices: list[int], fetch: Fetch) -> list[bytes]:
        """The bytes of `indices` (as `fetch` gives them): announced ones from their fetch,
        the others fetched now."""
        found: dict[int, list[bytes]] = {}
        with self.lock:
            claimed = []
            for slot, index in enumerate(indices):
                queue = self.pending.get(index)
                if queue:
                    claimed.append((slot, *queue.popleft()))
                    if not queue:
                        del self.pending[index]
        for slot, future, place, size in claimed:
            parts = future.result()
            per = len(parts) // size
            found[slot] = parts[place * per : (place + 1) * per]
        missing = [slot for slot in range(len(indices)) if slot not in found]
        if missing:
            parts = fetch([indices[slot] for slot in missing])
            per = len(parts) // len(missing)
            for n, slot in enumerate(missing):
                found[slot] = parts[n * per : (n + 1) * per]
        return [part for slot in range(len(indices)) for part in found[slot]]

    def reset(self) -> None:
        """Forget what was announced (a new pass over the sampler begins)."""
        with self.lock:
            for queue in self.pending.values():
                for future, _, _ in queue:
                    future.cancel()
            self.pending.clear()


class ReadAheadSampler(ShardSampler):
    """A ShardSampler that announces its next `ahead` samples to the dataset, `group` at a
    time (the dataset needs `fetch(indices)` and an `ahead` slot for a ReadAhead)."""

    def __init__(self, dataset: Any, *, ahead: int, group: int, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.ahead = max(ahead, group)
        self.group = group

    def __iter__(self) -> Iterator[int]:
        dataset: Any = self.dataset
        if dataset.ahead is None:
            dataset.ahead = ReadAhead()
        reader: ReadAhead = dataset.ahead
        reader.reset()
        source = super().__iter__()
        queue: deque[int] = deque()
        # The depth grows a group at a time: a pass left after its first batch (the
        # shapes probe, the end of a run) leaves little fetched for nothing.
        depth = self.group

        def fill() -> None:
            while len(queue) < depth:
                group = list(itertools.islice(source, self.group))
                if not group:
                    return
                queue.extend(group)
                reader.announce(group, dataset.fetch)

        fill()
        while queue:
            yield queue.popleft()
            if len(queue) <= depth - self.group:
                depth = min(self.ahead, depth + self.group)
                fill()
