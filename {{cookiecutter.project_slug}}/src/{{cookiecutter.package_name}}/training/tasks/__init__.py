"""Example tasks. A task is one module: model, data, loss and metrics; edit it or add one."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.data import Dataset

# Batches are dicts of tensors; eval batches also carry a float `valid` mask.
Batch = dict[str, torch.Tensor]


class Task(Protocol):
    """What the trainer needs from a task."""

    name: str

    def build_model(self) -> nn.Module: ...

    def datasets(self) -> tuple[Dataset[Batch], Dataset[Batch]]: ...

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor: ...

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]: ...

    def finalize(self, sums: dict[str, float]) -> dict[str, float]: ...


KNOWN_TASKS = ("lm", "vision")


def load_task(name: str, data: str = "", options: dict[str, Any] | None = None) -> Task:
    """Build the task called `name` (a module in this package exposing `make_task`)."""
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError:
        present = [t for t in KNOWN_TASKS if importlib.util.find_spec(f"{__name__}.{t}")]
        raise ValueError(f"unknown task {name!r}: this project has {', '.join(present)}") from None
    task: Task = module.make_task(data=data, **(options or {}))
    return task
