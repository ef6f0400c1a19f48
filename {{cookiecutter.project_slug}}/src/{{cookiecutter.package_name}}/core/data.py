"""Shard data across replicas and feed it to the device with static shapes."""

from __future__ import annotations

import itertools
import sys
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    get_worker_info,
)

from .eval_data import VALID_KEY, eval_dataloader
from .sampling import ShardSampler, StreamPositions
from .transfer import ONLY_TENSORS, device_batches

__all__ = ["VALID_KEY", "DeviceFeeder", "HostShard", "eval_dataloader", "prepare_dataloader"]

if TYPE_CHECKING:
    from .strategies import Strategy


def _loader_shuffles(loader: DataLoader) -> bool:
    sampler = loader.sampler
    if isinstance(sampler, DistributedSampler):
        return bool(sampler.shuffle)
    return isinstance(sampler, RandomSampler)


def prepare_dataloader(
    loader: DataLoader,
    num_replicas: int,
    rank: int,
    *,
    seed: int = 0,
    drop_last: bool | None = None,
) -> DataLoader:
    """Return an equivalent DataLoader that reads only this replica's shard.

    Batch size, collate_fn, workers, pin_memory, generator and drop_last survive;
    shuffling follows the original loader. A user's DistributedSampler is kept; otherwise
    a `ShardSampler` (constant memory, resumable at any position) shards the data. An
    IterableDataset (a stream) is wrapped in `HostShard`: every replica reads its own
    samples, as many as every other replica.
    """
    if isinstance(loader.dataset, IterableDataset):
        return _rebuild(
            loader, HostShard(loader.dataset, num_replicas, rank), None, loader.drop_last
        )
    if isinstance(loader.sampler, DistributedSampler):
        return loader
    if loader.batch_sampler is not None and loader.batch_size is None:
        raise ValueError(
            "a custom batch_sampler cannot be sharded automatically: "
            "give the DataLoader a batch_size, or a DistributedSampler of your own"
        )
    keep_last = loader.drop_last if drop_last is None else drop_last
    sampler = ShardSampler(
        loader.dataset,
        num_replicas=num_replicas,
        rank=rank,
        shuffle=_loader_shuffles(loader),
        seed=seed,
        drop_last=keep_last,
    )
    return _rebuild(loader, loader.dataset, sampler, keep_last)


def _rebuild(loader: DataLoader, dataset: Any, sampler: Any, drop_last: bool) -> DataLoader:
    """The same loader over another dataset or sampler."""
    return DataLoader(
        dataset,
        batch_size=loader.batch_size,
        sampler=sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        prefetch_factor=loader.prefetch_factor if loader.num_workers > 0 else None,
        persistent_workers=loader.persistent_workers,
    )


class HostShard(IterableDataset[Any]):
    """One replica's share of a stream: sample `rank` of every complete group of `replicas`.

    Every replica yields the same number of samples (a final incomplete group is
    dropped), so no replica runs a step the others do not. DataLoader workers of one
    replica take turns over the groups. `set_epoch` reaches the stream if it has one.
    """

    def __init__(self, stream: IterableDataset[Any], replicas: int, rank: int) -> None:
        self.stream = stream
        self.replicas = replicas
        self.rank = rank

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.stream, "set_epoch"):
            self.stream.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        worker = get_worker_info()
        workers, worker_id = (worker.num_workers, worker.id) if worker else (1, 0)
        group: list[Any] = []
        index = 0
        for sample in self.stream:
            group.append(sample)
            if len(group) < self.replicas:
                continue
            if index % workers == worker_id:
                yield group[self.rank]
            group = []
            index += 1


def set_epoch(loader: DataLoader, epoch: int) -> None:
    """Reshuffle a sharded loader (or stream) for a new epoch (no-op for other kinds)."""
    for part in (loader.sampler, loader.dataset):
        if hasattr(part, "set_epoch"):
            part.set_epoch(epoch)


def check_batch(batch: Any, path: str = "batch") -> None:
    """Raise TypeError naming the first non-tensor member of a batch, before any transfer."""
    if isinstance(batch, torch.Tensor):
        return
    if isinstance(batch, Mapping):
        for key, value in batch.items():
            check_batch(value, f"{path}[{key!r}]")
        return
    if isinstance(batch, (list, tuple)):
        for i, value in enumerate(batch):
            check_batch(value, f"{path}[{i}]")
        return
    raise TypeError(
        f"{path} is a {type(batch).__name__}, not a tensor: {ONLY_TENSORS}, "
        "so convert it in the dataset or collate_fn (or drop it from the batch)"
    )


class DeviceFeeder:
    """Feeds one replica's CPU loader to its device, epoch by epoch.

    Built once: it checks that batches hold only tensors and asks the strategy how a
    batch is laid out over the devices. Each `epoch()` reshuffles and returns the batches
    on the device, moved ahead of the step that needs them (`transfer.device_batches`, the
    backend's). With `cut_steps` a lazy graph is cut before each batch (one batch, one
    step); without, the caller cuts it where its step ends, e.g. after the last of several
    accumulated micro-batches.
    """

    def __init__(self, loader: DataLoader, strategy: Strategy, cut_steps: bool = True) -> None:
        self.loader = loader
        # The graph is cut before every k-th batch; never reaching k leaves it to the caller.
        self.batches_per_execution = 1 if cut_steps else sys.maxsize
        self.sample = next(iter(loader))  # on the host, as the loader gives it
        check_batch(self.sample)
        self.sharding = strategy.input_sharding(self.sample)
        stream = loader.dataset.stream if isinstance(loader.dataset, HostShard) else None
        self.positions = (
            StreamPositions(stream)
            if stream is not None and StreamPositions.resumable(stream, loader.num_workers)
            else None
        )

    def __len__(self) -> int:
        return len(self.loader)

    def epoch(self, epoch: int, skip_batches: int = 0, stream_state: str = "") -> Any:
        """Device batches of `epoch`, resuming after `skip_batches` already-trained batches.

        A ShardSampler starts at that position: nothing is read twice. A stream resumes from
        `stream_state` (its `state_dict()` saved after the last trained batch); a stream
        without one is read again from its start, and the batches trained are skipped.
        """
        set_epoch(self.loader, epoch)
        source: Any = self.loader
        sampler = self.loader.sampler
        if isinstance(sampler, ShardSampler):
            sampler.start_at(skip_batches * (self.loader.batch_size or 1))
        elif self.positions is not None and stream_state:
            self.positions.restore(stream_state)
            source = self._tracked(skip_batches)
        elif skip_batches:
            warnings.warn(
                f"resuming by reading {skip_batches} batches again to skip them (the data "
                "cannot start at a position): the wait grows with the step. A stream with "
                "state_dict()/load_state_dict() (num_workers 0) resumes at once.",
                stacklevel=2,
            )
            source = itertools.islice(self._tracked(0), skip_batches, None)
        elif self.positions is not None:
            source = self._tracked(0)
        return device_batches(source, self.batches_per_execution, self.sharding)

    def _tracked(self, first: int) -> Iterator[Any]:
        """The loader's batches, the stream's state remembered after each (when it has one)."""
        if self.positions is None:
            yield from self.loader
            return
        self.positions.clear()
        for count, batch in enumerate(self.loader, start=first + 1):
            self.positions.record(count)
            yield batch

    def stream_state(self, batches: int) -> str:
        """A resumable stream's state after `batches` batches of this epoch ("" for none)."""
        return self.positions.after(batches) if self.positions is not None else ""
