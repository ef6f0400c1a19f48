"""Optimizers and learning-rate schedules from the config (or the task's own optimizer)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .config import ConfigError, TrainConfig

OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
    "rmsprop": torch.optim.RMSprop,
    "adafactor": torch.optim.Adafactor,
}
SCHEDULES = ("cosine", "linear", "constant")


def build_optimizer(
    model: nn.Module, config: TrainConfig, task: Any = None
) -> torch.optim.Optimizer:
    """The task's `configure_optimizer(model, config)` if it has one, else `config.optimizer`."""
    hook = getattr(task, "configure_optimizer", None)
    if callable(hook):
        optimizer = hook(model, config)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(
                f"configure_optimizer returned {type(optimizer).__name__}, not a torch optimizer"
            )
        return optimizer
    kind = OPTIMIZERS[config.optimizer]
    options = {"lr": config.lr, "weight_decay": config.weight_decay, **config.optimizer_options}
    try:
        return kind(model.parameters(), **options)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"optimizer {config.optimizer!r}: {error}") from None


def lr_lambda(schedule: str, warmup: int, total: int) -> Callable[[int], float]:
    """Linear warm-up, then cosine/linear decay to 10% (or constant)."""

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "linear":
            return 1.0 - 0.9 * progress
        return 0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))

    return factor


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: TrainConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(config.schedule, config.warmup_steps, total_steps)
    )
