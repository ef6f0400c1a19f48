"""Evaluation: the task's per-sample metrics, padding masked, averaged over real samples."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..core import DeviceFeeder, Precision, Strategy, eval_dataloader, ops
from ..core.data import VALID_KEY
from ..core.launcher import Plan
from ..tasks import WEIGHT, Task, block_class, load_task, summarize, without_documents
from .config import TrainConfig

SAMPLES = "__samples__"  # the weight of the real samples (their count), beside the metrics

HostRead = Callable[[], contextlib.AbstractContextManager[None]]


class Evaluator:
    """Runs the eval set through a model: full static batches, each real sample once.

    The loader pads the last batches and flags padded samples in a `valid` key that the
    task never sees: per-sample metrics are multiplied by it here, summed across
    replicas on the device, read once, and averaged over the real samples (weighted by
    the task's `weight` metric when it gives one: tokens that carry loss, not samples).
    """

    def __init__(
        self,
        task: Task,
        strategy: Strategy,
        precision: Precision,
        config: TrainConfig,
        host_read: HostRead = contextlib.nullcontext,
    ) -> None:
        self.task = task
        self.strategy = strategy
        self.precision = precision
        self.host_read = host_read
        self.documents = config.document_masking
        replicas, rank = strategy.data_layout()
        dataset = task.eval_dataset()
        shards = strategy.local_batch_shards()
        samples = len(dataset)  # type: ignore[arg-type]
        self.batch_size = eval_batch_size(config, samples, replicas * shards)
        loader = eval_dataloader(
            dataset, self.batch_size * shards, replicas, rank, num_workers=config.num_workers
        )
        self.feeder = DeviceFeeder(loader, strategy)
        self.global_batch = self.batch_size * shards * replicas
        self.limit = config.eval_batches  # batches an evaluation reads at most (0: all)
        self.runs = 0

    def __call__(self, model: nn.Module) -> dict[str, float]:
        """Metrics of `model` over the whole eval set (the model is left in train mode)."""
        model.eval()
        self.runs += 1
        sums: dict[str, torch.Tensor] | None = None
        # XLA_USE_BF16 stores every device float as bf16 (4096 + 1 == 4096), so the
        # legacy mode sums on the host instead, at one transfer per eval batch.
        host: dict[str, float] = {}
        with torch.no_grad(), contextlib.closing(self.feeder.epoch(0)) as batches:
            for index, batch in enumerate(batches):
                if self.limit and index == self.limit:  # every replica stops at the same batch
                    break
                part = self._batch_sums(model, batch)
                if self.precision.legacy_env:
                    with self.host_read():
                        for key, value in part.items():
                            total = self.strategy.all_reduce_sum(value)
                            host[key] = host.get(key, 0.0) + float(total.item())
                    continue
                if sums is None:
                    # Host zeros of shape (1,) arrive as device data (0-d ones would be
                    # constants), like later batches' sums: every batch runs one graph.
                    device = next(iter(part.values())).device
                    sums = {k: torch.zeros(1, dtype=torch.float32).to(device) for k in part}
                sums = {k: sums[k] + part[k] for k in sums}
        model.train()
        if sums is not None:
            reduced = {k: self.strategy.all_reduce_sum(v) for k, v in sums.items()}
            ops.sync()
            with self.host_read():
                host = {k: float(v.item()) for k, v in reduced.items()}
        count = max(host.pop(SAMPLES, 0.0), 1.0)
        return summarize(self.task, {key: value / count for key, value in host.items()})

    def _batch_sums(self, model: nn.Module, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The batch's metric sums over its real samples, and their count."""
        valid = batch[VALID_KEY].float()
        inputs = {k: v for k, v in batch.items() if k != VALID_KEY}
        inputs = self.precision.convert_batch(
            inputs if self.documents else without_documents(inputs)
        )
        with self.precision.forward_context():
            per_sample = self.task.metrics(model, inputs)
        rows = valid.shape[0]
        weight = per_sample.pop(WEIGHT, None)
        if weight is not None:
            valid = valid * weight.float()
        for key, value in per_sample.items():
            if value.shape != (rows,):
                raise ValueError(
                    f"metric {key!r} has shape {tuple(value.shape)}, but metrics are per "
                    f"sample: return one value per sample, shape ({rows},)"
                )
        sums = {key: (value.float() * valid).sum() for key, value in per_sample.items()}
        sums[SAMPLES] = valid.sum()
        return sums


def eval_batch_size(config: TrainConfig, samples: int, shards: int) -> int:
    """Samples per batch shard of evaluation: `eval_batch_size` (0: the training
    `batch_size`), but no more than the split fills: its batch is never padded past it."""
    wanted = config.eval_batch_size or config.batch_size
    return max(1, min(wanted, -(-samples // shards)))


def evaluate_checkpoint(config: TrainConfig, plan: Plan, path: str) -> dict[str, float]:
    """A checkpoint's eval metrics under any plan: no optimizer, no training data."""
    from .checkpoint import load_weights
    from .model import build, read_over, sharding_rules, unscanned

    precision = Precision.from_name(config.precision)
    task = load_task(config.task, config.data, config.task_options)
    built = build(task, unscanned(config))  # as the run built it (a LoRA base too)
    model = built.model
    rules = sharding_rules(task, model, config, plan.strategy)
    model, _ = plan.strategy.setup_model(
        model, block_class(task, model), rules=rules, source=read_over(built)
    )
    load_weights(path, plan.strategy, model)  # resharded to this strategy's layout
    return Evaluator(task, plan.strategy, precision, config)(model)
