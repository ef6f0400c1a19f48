"""Training: configuration, the loop, evaluation, checkpoints, and entry points that launch them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from ..core import Plan, Precision, launch, make_plan
from .config import ConfigError, TrainConfig, build_config
from .loop import fit

__all__ = [
    "ConfigError",
    "TrainConfig",
    "build_config",
    "fit",
    "notebook_launch",
    "plan_of",
    "train",
]


def plan_of(config: TrainConfig) -> Plan:
    """The run plan a config asks for (RuntimeConfigError says what to change)."""
    return make_plan(config.accelerator, config.devices, config.strategy, config.mesh)


def train(
    config: TrainConfig, model: nn.Module | None = None, start_method: str = "spawn"
) -> dict[str, Any]:
    """Plan and launch a run (one process, one per device, or SPMD); return its summary."""
    plan = plan_of(config)
    if config.scan_layers:
        plan.strategy.check_scan()  # before launch: SPMD, once on, stays on in this process
    Precision.from_name(config.precision).apply_environment()
    result = launch(fit, plan, args=(config, plan, None, model), start_method=start_method)
    if isinstance(result, dict):
        return result
    # Spawned replicas cannot return values: the master wrote the summary.
    summary: dict[str, Any] = json.loads((Path(config.run_dir) / "summary.json").read_text())
    return summary


def notebook_launch(config: TrainConfig, model: nn.Module) -> dict[str, Any]:
    """Train from a notebook (Colab, Kaggle): fork, and share the model built once outside.

    Build the model in the notebook before calling this and do not touch an XLA
    device first: forked replicas would inherit a started runtime and fail.
    """
    return train(config, model=model, start_method="fork")
