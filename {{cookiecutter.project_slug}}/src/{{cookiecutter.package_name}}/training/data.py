"""The training data of a run: the task's dataset, sharded for this process, fed to XLA."""

from __future__ import annotations

from torch.utils.data import DataLoader, IterableDataset, Sampler

from ..core import DeviceFeeder, Strategy, prepare_dataloader
from ..tasks import Task
from .config import ConfigError, TrainConfig

READ_AHEAD_BATCHES = 4  # batches of a remote dataset fetched while the step runs


def training_data(
    task: Task, strategy: Strategy, config: TrainConfig
) -> tuple[DeviceFeeder, int | None]:
    """The device feeder of this process's shard, and optimizer steps per epoch (None: a stream).

    Every process reads its own part: map-style datasets through a ShardSampler (a
    DistributedSampler in constant memory, reshuffled each epoch, that a resumed run starts
    at its position), streams by taking every replicas-th sample. The ragged last batch is
    dropped: a smaller batch would compile a new graph.
    """
    dataset = task.train_dataset()
    replicas, rank = strategy.data_layout()
    per_process = config.batch_size * strategy.local_batch_shards()
    streaming = isinstance(dataset, IterableDataset)
    if streaming and config.max_steps < 1:
        raise ConfigError(
            "the task's training set is a stream (an IterableDataset) with no length: "
            "set max_steps instead of max_epochs"
        )
    if not streaming:
        needed = per_process * replicas * config.grad_accum
        if len(dataset) < needed:  # type: ignore[arg-type]
            raise ConfigError(
                f"the training set has {len(dataset)} samples, fewer than one global "  # type: ignore[arg-type]
                f"batch ({needed}): lower batch_size"
            )
    sampler = _read_ahead(dataset, replicas, rank, per_process, config)
    loader = DataLoader(
        dataset,
        batch_size=per_process,
        shuffle=not streaming and sampler is None,
        sampler=sampler,
        drop_last=True,
        num_workers=config.num_workers,
    )
    sharded = prepare_dataloader(loader, replicas, rank, seed=config.seed)
    feeder = DeviceFeeder(sharded, strategy, cut_steps=False)  # the loop cuts each step
    return feeder, None if streaming else len(sharded) // config.grad_accum


def _read_ahead(
    dataset: object, replicas: int, rank: int, per_process: int, config: TrainConfig
) -> Sampler[int] | None:
    """For a dataset read over the network (a prepared dataset on gs://), the sampler that
    has it fetch the next batches while the step runs; None: the usual shuffling sampler.

    The dataset makes it (`read_ahead_sampler`): the loop knows no dataset's storage. With
    DataLoader workers, they prefetch in their own processes instead.
    """
    make = getattr(dataset, "read_ahead_sampler", None)
    if make is None or config.num_workers:
        return None
    sampler: Sampler[int] | None = make(
        ahead=READ_AHEAD_BATCHES * per_process,
        group=per_process,
        num_replicas=replicas,
        rank=rank,
        shuffle=True,
        seed=config.seed,
        drop_last=True,
    )
    return sampler
