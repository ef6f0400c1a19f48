"""Tasks: one module each, giving a model, datasets, a loss and per-sample metrics.

This is the package to edit: copy an example module, change it, and select it with
`task = "<module name>"` in a config. `docs/your-model.md` walks through it.
A module `my_task.py` is the task `my-task` (or `my_task`) and exposes
`make_task(data: str = "", **task_options) -> Task`.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset

# Samples and batches are dicts of tensors with static shapes.
Batch = dict[str, torch.Tensor]

# A per-sample metric of this name weighs the others: the eval means become sums weighted by
# it over their sum (a sample's count of loss-carrying tokens, so the eval loss is per token).
WEIGHT = "weight"


class Task(Protocol):
    """What the framework needs from a task.

    Optional, looked up when present:
      block_class: type[nn.Module]     the repeated block: fsdp wraps each one, and
                                       activation checkpointing recomputes it
      tokens_per_sample: int           tokens in one sample, for tokens/s
      summarize(means) -> dict         derived eval metrics (perplexity, ...)
      configure_optimizer(model, config) -> torch.optim.Optimizer
                                       the task's own optimizer instead of `optimizer = ...`
      train_metrics(model) -> dict[str, torch.Tensor]
                                       device scalars of the last training forward, logged
                                       with the loss (default: a mixture of experts' router
                                       numbers)
    """

    name: str

    def build_model(self) -> nn.Module:
        """The model, on the host: the framework moves, re-ties and shards it."""
        ...

    def train_dataset(self) -> Dataset[Batch] | IterableDataset[Batch]:
        """Training samples: map-style, or iterable (streaming; sharded per host)."""
        ...

    def eval_dataset(self) -> Dataset[Batch]:
        """Evaluation samples (map-style): each is counted exactly once."""
        ...

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """The scalar training loss of a batch (a mean over its samples)."""
        ...

    def metrics(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        """Per-sample eval metrics, each of shape (batch,); the framework averages them
        (weighted by the `weight` metric when there is one)."""
        ...


def module_name(task: str) -> str:
    return task.replace("-", "_")


def available() -> list[str]:
    """Task modules in this package."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def load_task(name: str, data: str = "", options: dict[str, Any] | None = None) -> Task:
    """Build the task called `name` (a module in this package exposing `make_task`)."""
    if module_name(name) not in available():
        raise ValueError(f"unknown task {name!r}: this project has {', '.join(available())}")
    module = importlib.import_module(f"{__name__}.{module_name(name)}")
    try:
        task: Task = module.make_task(data=data, **(options or {}))
    except TypeError as error:
        if "unexpected keyword argument" not in str(error):
            raise
        raise ValueError(f"task {name!r} has no option {str(error).split()[-1]}") from None
    return task


def block_class(task: Task, model: nn.Module) -> type[nn.Module] | None:
    """The task's repeated block class: its `block_class`, a Hugging Face model's decoder
    layer, or the model's BlockStack blocks."""
    from .. import hf
    from ..core.layers import block_class_of

    return getattr(task, "block_class", None) or hf.block_class(model) or block_class_of(model)


def train_metrics(task: Task, model: nn.Module) -> dict[str, torch.Tensor]:
    """Device scalars of the last training forward to log with its loss: the task's
    `train_metrics(model)`, else a Hugging Face mixture of experts' router numbers."""
    hook = getattr(task, "train_metrics", None)
    if callable(hook):
        return dict(hook(model))
    from ..hf.moe import router_metrics  # empty for a model without experts

    return router_metrics(model)


def summarize(task: Task, means: dict[str, float]) -> dict[str, float]:
    """The task's reported eval metrics: its `summarize(means)`, or the means themselves."""
    hook = getattr(task, "summarize", None)
    return dict(hook(means)) if callable(hook) else means
