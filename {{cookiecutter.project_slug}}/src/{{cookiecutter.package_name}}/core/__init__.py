"""Everything backend-specific lives in this package, and only here: this project's backend
is {% if cookiecutter.backend == "torch_tpu" %}TorchTPU (`torch_tpu`, native PyTorch on `torch.device("tpu")`){% else %}PyTorch/XLA (`torch_xla`){% endif %}.

Its modules answer one interface whatever the backend (one module per concern: runtime,
strategies, the compiled step, checkpoint I/O, health, precision, device transfer), so the
rest of the package is the same for both. Importing it imports neither torch nor the
backend and starts no device: names are loaded from their submodule on first use, so
`--help` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "DeviceFeeder": "data",
    "check_batch": "data",
    "eval_dataloader": "data",
    "prepare_dataloader": "data",
    "set_epoch": "data",
    "HealthError": "health",
    "StepGuard": "health",
    "snapshot": "health",
    "Plan": "launcher",
    "launch": "launcher",
    "make_plan": "launcher",
    "Precision": "precision",
    "ReplayedStep": "replay",
    "RuntimeConfigError": "runtime",
    "Strategy": "strategies",
    "configure": "runtime",
    "detect_accelerator": "runtime",
    "TieReport": "tying",
    "find_shared_parameters": "tying",
    "move_and_retie": "tying",
    "move_to_device": "tying",
}

__all__ = [
    "DeviceFeeder",
    "HealthError",
    "Plan",
    "Precision",
    "ReplayedStep",
    "RuntimeConfigError",
    "StepGuard",
    "Strategy",
    "TieReport",
    "check_batch",
    "configure",
    "detect_accelerator",
    "eval_dataloader",
    "find_shared_parameters",
    "launch",
    "make_plan",
    "move_and_retie",
    "move_to_device",
    "prepare_dataloader",
    "set_epoch",
    "snapshot",
]

if TYPE_CHECKING:
    from .data import (
        DeviceFeeder,
        check_batch,
        eval_dataloader,
        prepare_dataloader,
        set_epoch,
    )
    from .health import HealthError, StepGuard, snapshot
    from .launcher import Plan, launch, make_plan
    from .precision import Precision
    from .replay import ReplayedStep
    from .runtime import RuntimeConfigError, configure, detect_accelerator
    from .strategies import Strategy
    from .tying import TieReport, find_shared_parameters, move_and_retie, move_to_device


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value
