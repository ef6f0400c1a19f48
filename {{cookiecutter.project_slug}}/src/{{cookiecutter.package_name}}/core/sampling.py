"""Where each replica's samples come from, in constant memory, from any position of an epoch.

`ShardSampler` is a DistributedSampler (same shards, same padding or dropping, reshuffled
by seed and epoch) that never lists the dataset's indices: a keyed permutation (a Feistel
network, cycle-walked into range) gives the index at any position, so a corpus of any size
costs no host memory, and a resumed run starts at its position without reading anything.
`StreamPositions` remembers a stream's `state_dict()` after each batch it gave, so a
checkpoint can save the state after the last batch trained (not the last one prefetched).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import DistributedSampler

CHUNK = 4096  # indices computed at once
ROUNDS = 4
MIX = np.uint64(0x9E3779B97F4A7C15)


def _round_keys(seed: int, epoch: int) -> list[np.uint64]:
    state = np.random.SeedSequence([seed & 0xFFFFFFFF, epoch & 0xFFFFFFFF, 0x5EED])
    return [np.uint64(k) for k in state.generate_state(ROUNDS, dtype=np.uint64)]


def _feistel(x: np.ndarray, half: int, keys: list[np.uint64]) -> np.ndarray:
    """A bijection of [0, 4**half): balanced Feistel rounds of a multiply-xorshift mix."""
    mask = np.uint64((1 << half) - 1)
    left, right = x >> np.uint64(half), x & mask
    for key in keys:
        mixed = (right ^ key) * MIX
        mixed ^= mixed >> np.uint64(29)
        left, right = right, left ^ (mixed & mask)
    return (left << np.uint64(half)) | right


def permuted(positions: np.ndarray, length: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of range(length) keyed by (seed, epoch), at `positions`."""
    half = max(1, (max(length - 1, 1).bit_length() + 1) // 2)
    keys = _round_keys(seed, epoch)
    out = _feistel(positions.astype(np.uint64), half, keys)
    outside = out >= length
    while outside.any():  # cycle-walking: a bijection of the larger domain, restricted
        out[outside] = _feistel(out[outside], half, keys)
        outside = out >= length
    return out.astype(np.int64)


class ShardSampler(DistributedSampler):  # type: ignore[type-arg]
    """A DistributedSampler in constant memory that can start an epoch at any position."""

    def __init__(self, dataset: Any, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.start = 0  # samples of this replica's epoch already trained

    def start_at(self, position: int) -> None:
        """Begin the next pass `position` samples into this replica's epoch."""
        self.start = min(max(0, position), self.num_samples)

    def __len__(self) -> int:
        return self.num_samples - self.start

    def __iter__(self) -> Iterator[int]:
        length = len(self.dataset)  # type: ignore[arg-type]
        step = self.num_replicas
        first = self.rank + self.start * step
        for begin in range(first, self.total_size, CHUNK * step):
            positions = np.arange(begin, min(begin + CHUNK * step, self.total_size), step)
            positions %= length  # padding repeats the epoch's first samples, as torch's does
            indices = (
                permuted(positions, length, self.seed, self.epoch) if self.shuffle else positions
            )
            yield from indices.tolist()


class StreamPositions:
    """A stream's state after each batch a loader gave, for the checkpoint of the last trained.

    Only streams with `state_dict()` and `load_state_dict()` whose state is JSON, read in the
    training process (num_workers = 0), are tracked; others are replayed on resume.
    """

    KEEP = 512  # batches a loader can be ahead of training: its prefetch queues

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.states: OrderedDict[int, str] = OrderedDict()

    @staticmethod
    def resumable(stream: Any, num_workers: int) -> bool:
        return num_workers == 0 and all(
            callable(getattr(stream, name, None)) for name in ("state_dict", "load_state_dict")
        )

    def clear(self) -> None:
        self.states.clear()

    def record(self, batches: int) -> None:
        try:
            self.states[batches] = json.dumps(self.stream.state_dict())
        except (TypeError, ValueError):
            return  # not JSON: this stream is replayed on resume
        while len(self.states) > self.KEEP:
            self.states.popitem(last=False)

    def after(self, batches: int) -> str:
        """The state after `batches` batches of this epoch ("" for none, or one forgotten)."""
        return self.states.get(batches, "") if batches else ""

    def restore(self, state: str) -> None:
        self.stream.load_state_dict(json.loads(state))
