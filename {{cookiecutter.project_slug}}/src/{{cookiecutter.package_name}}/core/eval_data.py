"""Evaluation batches: every real sample counted once, in full static-shape batches."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

VALID_KEY = "valid"


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
