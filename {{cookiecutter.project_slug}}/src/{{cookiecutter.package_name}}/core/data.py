"""Shard data across replicas and feed it to XLA devices with static shapes."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
)

from . import runtime

VALID_KEY = "valid"


def replica_layout(strategy: str) -> tuple[int, int]:
    """Return (num_replicas, rank) that data must be sharded over for a strategy.

    Under ddp every process is a replica. Under spmd one process feeds all local
    devices and the batch is sharded over the mesh, so hosts are the replicas.
    """
    if strategy == "ddp":
        return runtime.world_size(), runtime.global_ordinal()
    if strategy == "spmd":
        return runtime.process_count(), runtime.process_index()
    return 1, 0


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
    shuffling follows the original loader. A user's DistributedSampler is kept, and
    an IterableDataset (which shards itself) is returned unchanged with a warning.
    """
    if isinstance(loader.dataset, IterableDataset):
        warnings.warn(
            "IterableDataset given: it is not re-sampled, so it must shard itself "
            f"across {num_replicas} replicas (e.g. by rank {rank})",
            stacklevel=2,
        )
        return loader
    if isinstance(loader.sampler, DistributedSampler):
        return loader
    if loader.batch_sampler is not None and loader.batch_size is None:
        raise ValueError(
            "a custom batch_sampler cannot be sharded automatically: "
            "give the DataLoader a batch_size, or a DistributedSampler of your own"
        )
    keep_last = loader.drop_last if drop_last is None else drop_last
    sampler: DistributedSampler[Any] = DistributedSampler(
        loader.dataset,
        num_replicas=num_replicas,
        rank=rank,
        shuffle=_loader_shuffles(loader),
        seed=seed,
        drop_last=keep_last,
    )
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=keep_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        prefetch_factor=loader.prefetch_factor if loader.num_workers > 0 else None,
        persistent_workers=loader.persistent_workers,
    )


def set_epoch(loader: DataLoader, epoch: int) -> None:
    """Reshuffle a sharded loader for a new epoch (no-op for other samplers)."""
    sampler = loader.sampler
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)


class EvalShardSampler(Sampler[int]):
    """Strided shard of `range(padded)` where `padded` fills every batch of every replica.

    Indices past the dataset's end are padding; `MaskedDataset` marks them invalid
    so each real sample is counted exactly once across replicas.
    """

    def __init__(self, length: int, num_replicas: int, rank: int, batch_size: int) -> None:
        self.length = length
        self.num_replicas = num_replicas
        self.rank = rank
        global_batch = num_replicas * batch_size
        self.padded = max(1, math.ceil(length / global_batch)) * global_batch

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.padded, self.num_replicas))

    def __len__(self) -> int:
        return self.padded // self.num_replicas


class MaskedDataset(Dataset[dict[str, Any]]):
    """Dict-sample dataset whose indices past the end repeat sample 0 with `valid=0`."""

    def __init__(self, dataset: Dataset[Mapping[str, Any]]) -> None:
        self.dataset = dataset
        self.length = len(dataset)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        real = index < self.length
        sample = self.dataset[index if real else 0]
        if not isinstance(sample, Mapping):
            raise TypeError(
                f"eval samples must be dicts of tensors, got {type(sample).__name__}: "
                "return {'x': ..., 'y': ...} from the dataset"
            )
        return {**sample, VALID_KEY: torch.tensor(1.0 if real else 0.0)}


def eval_dataloader(
    dataset: Dataset[Mapping[str, Any]],
    batch_size: int,
    num_replicas: int,
    rank: int,
    **kwargs: Any,
) -> DataLoader:
    """Loader of full, static-shape batches whose padding is flagged by a `valid` key."""
    sampler = EvalShardSampler(len(dataset), num_replicas, rank, batch_size)  # type: ignore[arg-type]
    return DataLoader(
        MaskedDataset(dataset), batch_size=batch_size, sampler=sampler, drop_last=True, **kwargs
    )


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
        f"{path} is a {type(batch).__name__}, not a tensor: XLA devices take only tensors, "
        "so convert it in the dataset or collate_fn (or drop it from the batch)"
    )


def data_mesh() -> Any:
    """A 1-D mesh named `data` over every device of the job (SPMD)."""
    import numpy as np
    import torch_xla.distributed.spmd as xs

    count = runtime.global_device_count()
    return xs.Mesh(np.arange(count), (count,), ("data",))


def _batch_sharding(sample: Any, mesh: Any) -> Any:
    """Shard dim 0 of every batch member over the mesh; other dims are replicated."""
    import torch_xla.distributed.spmd as xs

    multi_host = runtime.process_count() > 1
    if isinstance(sample, Mapping):
        return {
            key: xs.ShardingSpec(
                mesh, ("data",) + (None,) * (value.dim() - 1), minibatch=multi_host
            )
            for key, value in sample.items()
        }
    ranks = {t.dim() for t in (sample if isinstance(sample, (list, tuple)) else [sample])}
    if len(ranks) != 1:
        raise ValueError("spmd batches of mixed-rank tensors must be dicts (one spec per key)")
    rank = ranks.pop()
    return xs.ShardingSpec(mesh, ("data",) + (None,) * (rank - 1), minibatch=multi_host)


class DeviceFeeder:
    """Feeds one replica's CPU loader to its XLA device, epoch by epoch.

    Built once: it checks that batches hold only tensors and, under spmd, derives
    the batch sharding over the data mesh. Each `epoch()` reshuffles and returns
    torch_xla's MpDeviceLoader, which cuts a step every `batches_per_step` batches.
    """

    def __init__(
        self, loader: DataLoader, strategy: str, batches_per_step: int = 1, mesh: Any = None
    ) -> None:
        self.loader = loader
        self.batches_per_step = batches_per_step
        sample = next(iter(loader))
        check_batch(sample)
        self.sharding = None
        if strategy == "spmd":
            self.sharding = _batch_sharding(sample, mesh if mesh is not None else data_mesh())

    def __len__(self) -> int:
        return len(self.loader)

    def epoch(self, epoch: int, skip_batches: int = 0) -> Any:
        """Device batches of `epoch`, resuming after `skip_batches` already-trained batches."""
        import itertools

        import torch_xla.distributed.parallel_loader as pl

        set_epoch(self.loader, epoch)
        source: Any = self.loader
        if skip_batches:
            source = itertools.islice(self.loader, skip_batches, None)
        return pl.MpDeviceLoader(
            source,
            runtime.device(),
            batches_per_execution=self.batches_per_step,
            input_sharding=self.sharding,
        )
