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
        return self._flagged(self.dataset[index if real else 0], real)

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        """A batch at once, through the dataset's own `__getitems__` when it has one: a
        dataset read in place on gs:// then fetches a batch's windows together, not one
        request after another."""
        many = getattr(self.dataset, "__getitems__", None)
        if many is None:
            return [self[index] for index in indices]
        real = [index < self.length for index in indices]
        samples = many([index if ok else 0 for index, ok in zip(indices, real, strict=True)])
        return [self._flagged(sample, ok) for sample, ok in zip(samples, real, strict=True)]

    @staticmethod
    def _flagged(sample: Any, real: bool) -> dict[str, Any]:
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
