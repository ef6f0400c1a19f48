"""Every replica reads its own shard, with the loader's settings and static batch shapes."""

import math
from collections import Counter

import pytest
import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    TensorDataset,
)

from {{ cookiecutter.package_name }}.core import (
    check_batch,
    eval_dataloader,
    prepare_dataloader,
    set_epoch,
)

WORLD_SIZES = range(1, 9)
# Lengths that divide evenly by every world size (840), and that do not (37, 5 < 8).
LENGTHS = (840, 37, 5)


def index_loader(length: int, **kwargs) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(length)), **kwargs)


def shard(loader: DataLoader) -> list[int]:
    """The dataset indices one replica's loader yields, in order."""
    return [int(i) for (batch,) in loader for i in batch]


def all_shards(length: int, world: int, **kwargs) -> list[list[int]]:
    return [
        shard(prepare_dataloader(index_loader(length, **kwargs), world, rank, seed=7))
        for rank in range(world)
    ]


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("world", WORLD_SIZES)
def test_shards_cover_dataset_with_equal_lengths_and_only_padding_repeated(world, length):
    """It splits a dataset into equal shards that cover it, repeating only the padding."""
    shards = all_shards(length, world, batch_size=4, shuffle=True)

    per_replica = math.ceil(length / world)
    assert [len(s) for s in shards] == [per_replica] * world
    counts = Counter(i for s in shards for i in s)
    assert set(counts) == set(range(length))
    # DistributedSampler pads the shards to equal length by repeating a few leading
    # indices, each on another replica: the only samples seen twice in an epoch.
    padding = per_replica * world - length
    assert padding < world
    assert all(len(set(s)) == len(s) for s in shards)
    assert sum(count - 1 for count in counts.values()) == padding


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("world", WORLD_SIZES)
def test_drop_last_shards_are_disjoint_and_batches_full(world, length):
    """It never repeats a sample with drop_last=True, and every batch is full."""
    batch_size = 2
    loaders = [
        prepare_dataloader(
            index_loader(length, batch_size=batch_size, shuffle=True, drop_last=True), world, rank
        )
        for rank in range(world)
    ]

    samples = [list(loader.sampler) for loader in loaders]
    assert [len(s) for s in samples] == [length // world] * world
    flat = [i for s in samples for i in s]
    assert len(flat) == len(set(flat))
    for loader in loaders:
        assert all(len(batch) == batch_size for (batch,) in loader)


def test_set_epoch_reshuffles_reproducibly():
    """It gives each epoch its own order, and the same order for the same epoch."""
    loader = prepare_dataloader(index_loader(64, batch_size=8, shuffle=True), 2, 0, seed=3)

    set_epoch(loader, 0)
    first = shard(loader)
    set_epoch(loader, 1)
    second = shard(loader)
    set_epoch(loader, 0)
    again = shard(loader)

    assert first != second
    assert first == again


def test_shuffle_follows_the_original_loader():
    """It keeps a sequential loader in order and shuffles a shuffling one."""
    sequential = prepare_dataloader(index_loader(64, batch_size=8), 4, 1)
    shuffled = prepare_dataloader(index_loader(64, batch_size=8, shuffle=True), 4, 1)

    assert shard(sequential) == list(range(1, 64, 4))
    assert shard(shuffled) != list(range(1, 64, 4))
    assert sorted(shard(shuffled)) != shard(shuffled)


def _collate_pairs(batch):
    return {"x": torch.stack([b[0] for b in batch])}


def _init_worker(worker_id: int) -> None:
    torch.manual_seed(worker_id)


def test_loader_settings_survive():
    """It keeps batch size, collate_fn, workers, pin_memory, generator and drop_last."""
    generator = torch.Generator().manual_seed(11)
    original = index_loader(
        50,
        batch_size=5,
        shuffle=True,
        collate_fn=_collate_pairs,
        num_workers=2,
        pin_memory=True,
        drop_last=True,
        generator=generator,
        worker_init_fn=_init_worker,
        prefetch_factor=3,
        persistent_workers=True,
        timeout=30,
    )

    prepared = prepare_dataloader(original, 4, 2)

    assert isinstance(prepared.sampler, DistributedSampler)
    assert (prepared.sampler.num_replicas, prepared.sampler.rank) == (4, 2)
    assert prepared.sampler.drop_last is True
    for name in (
        "batch_size",
        "collate_fn",
        "num_workers",
        "pin_memory",
        "drop_last",
        "generator",
        "worker_init_fn",
        "prefetch_factor",
        "persistent_workers",
        "timeout",
    ):
        assert getattr(prepared, name) == getattr(original, name), name


def test_user_distributed_sampler_is_kept():
    """It returns a loader that already has a DistributedSampler unchanged."""
    dataset = TensorDataset(torch.arange(20))
    own = DistributedSampler(dataset, num_replicas=5, rank=3, shuffle=False)
    loader = DataLoader(dataset, batch_size=2, sampler=own)

    prepared = prepare_dataloader(loader, 2, 0)

    assert prepared is loader
    assert prepared.sampler is own


class DictDataset(Dataset):
    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"index": torch.tensor(index), "x": torch.full((3,), float(index))}


@pytest.mark.parametrize("world", [1, 3, 8])
@pytest.mark.parametrize("length", [37, 48, 2])
def test_eval_loader_counts_each_sample_once_in_full_batches(world, length):
    """It pads eval data to full batches and flags padding so each sample counts once."""
    batch_size = 4
    seen: list[int] = []
    batches_per_rank = []
    for rank in range(world):
        batches = list(eval_dataloader(DictDataset(length), batch_size, world, rank))
        batches_per_rank.append(len(batches))
        for batch in batches:
            assert batch["x"].shape == (batch_size, 3)
            assert batch["valid"].shape == (batch_size,)
            seen += batch["index"][batch["valid"] == 1].tolist()

    assert sorted(seen) == list(range(length))
    assert len(set(batches_per_rank)) == 1, "replicas must run the same number of eval steps"


class BatchReads(DictDataset):
    """A DictDataset read a batch at a time (as a dataset on gs:// fetches its windows)."""

    def __init__(self, length: int) -> None:
        super().__init__(length)
        self.reads: list[list[int]] = []

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        raise AssertionError("read one sample at a time")

    def __getitems__(self, indices: list[int]) -> list[dict[str, torch.Tensor]]:
        self.reads.append(list(indices))
        return [DictDataset.__getitem__(self, index) for index in indices]


def test_eval_loader_reads_a_batch_at_once_where_the_dataset_can():
    """It asks a dataset with `__getitems__` for each batch at once, padding included."""
    dataset = BatchReads(6)
    batches = list(eval_dataloader(dataset, 4, 1, 0))
    assert dataset.reads == [[0, 1, 2, 3], [4, 5, 0, 0]]  # the padding repeats sample 0
    assert [batch["valid"].tolist() for batch in batches] == [[1.0] * 4, [1.0, 1.0, 0.0, 0.0]]
    assert batches[1]["index"].tolist() == [4, 5, 0, 0]


class Stream(IterableDataset):
    """A stream of numbered samples; `set_epoch` reorders it, like a shuffled shard list."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = torch.randperm(self.length, generator=torch.Generator().manual_seed(self.epoch))
        for index in order.tolist():
            yield {"index": torch.tensor(index)}


def stream_shards(length: int, world: int, epoch: int = 0, workers: int = 0) -> list[list[int]]:
    """What every replica reads of one epoch of the stream, through prepared loaders."""
    shards = []
    for rank in range(world):
        loader = prepare_dataloader(
            DataLoader(Stream(length), batch_size=1, num_workers=workers), world, rank
        )
        set_epoch(loader, epoch)
        shards.append([int(batch["index"]) for batch in loader])
    return shards


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("world", WORLD_SIZES)
def test_stream_shards_are_distinct_and_equally_long(world, length):
    """It gives every replica of a stream its own samples, as many as every other replica."""
    shards = stream_shards(length, world)

    assert [len(s) for s in shards] == [length // world] * world
    flat = [i for s in shards for i in s]
    assert len(flat) == len(set(flat)) == (length // world) * world


def test_stream_epochs_restart_and_follow_set_epoch():
    """It reads the whole stream again each epoch, in the order set_epoch gives it."""
    first, again, second = (stream_shards(64, 4, epoch) for epoch in (0, 0, 1))

    assert first == again
    assert first != second
    for shards in (first, second):
        assert sorted(i for s in shards for i in s) == list(range(64))


def test_stream_workers_split_a_replicas_share():
    """It gives a replica the same samples whether one or two loader workers read them."""
    alone = stream_shards(40, 2)
    with_workers = stream_shards(40, 2, workers=2)

    assert [sorted(s) for s in with_workers] == [sorted(s) for s in alone]


def test_check_batch_names_the_offending_key_and_type():
    """It rejects a non-tensor batch member, naming its key and type."""
    with pytest.raises(TypeError, match=r"\['meta'\] is a str"):
        check_batch({"x": torch.zeros(2), "meta": "str"})


def test_check_batch_accepts_nested_tensors():
    """It accepts dicts, lists and tuples whose leaves are all tensors."""
    check_batch({"x": torch.zeros(2), "pair": (torch.ones(1), [torch.ones(3)])})


@pytest.mark.parametrize("length", [1, 2, 3, 37, 1000, 4099])
def test_shuffled_order_is_a_permutation_per_seed_and_epoch(length):
    """It orders every index once per epoch, differently for another epoch or seed."""
    import numpy as np

    from {{ cookiecutter.package_name }}.core.sampling import permuted

    positions = np.arange(length)
    order = permuted(positions, length, seed=3, epoch=0)
    assert sorted(order.tolist()) == list(range(length))
    if length > 3:
        assert order.tolist() != permuted(positions, length, seed=3, epoch=1).tolist()
        assert order.tolist() != permuted(positions, length, seed=4, epoch=0).tolist()


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("world", [1, 3])
def test_sampler_started_at_a_position_reads_only_the_rest(world, shuffle):
    """It resumes an epoch at a position with exactly the batches not yet read, none again."""
    from {{ cookiecutter.package_name }}.core.sampling import ShardSampler

    for rank in range(world):
        loader = prepare_dataloader(index_loader(101, batch_size=4, shuffle=shuffle), world, rank)
        assert isinstance(loader.sampler, ShardSampler)
        set_epoch(loader, 2)
        whole = shard(loader)
        loader.sampler.start_at(3 * 4)  # three batches were trained
        assert len(loader) == math.ceil(len(whole) / 4) - 3
        assert shard(loader) == whole[12:]


def test_sampler_memory_does_not_grow_with_the_dataset():
    """It computes indices in chunks: a billion samples cost no list of a billion."""
    import tracemalloc

    from {{ cookiecutter.package_name }}.core.sampling import ShardSampler

    class Huge(Dataset):
        def __len__(self):
            return 1_000_000_000

    sampler = ShardSampler(Huge(), num_replicas=4, rank=1, shuffle=True, seed=0)
    sampler.start_at(200_000_000)
    tracemalloc.start()
    first = [index for _, index in zip(range(10_000), iter(sampler), strict=False)]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(set(first)) == 10_000 and max(first) < 1_000_000_000
    assert peak < 20_000_000  # bytes; the indices alone would take gigabytes
