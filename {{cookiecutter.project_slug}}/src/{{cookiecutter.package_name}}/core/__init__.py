"""Everything torch_xla-specific lives in this package, and only here.

Importing it does not import torch_xla nor start the XLA runtime; each function
imports what it needs when called.
"""

from .data import (
    DeviceFeeder,
    check_batch,
    eval_dataloader,
    prepare_dataloader,
    replica_layout,
    set_epoch,
)
from .health import XlaGuard, XlaHealthError, snapshot
from .launch import Plan, launch, make_plan
from .precision import Precision
from .runtime import RuntimeConfigError, configure, detect_accelerator
from .tying import find_shared_parameters, move_to_device

__all__ = [
    "DeviceFeeder",
    "Plan",
    "Precision",
    "RuntimeConfigError",
    "XlaGuard",
    "XlaHealthError",
    "check_batch",
    "configure",
    "detect_accelerator",
    "eval_dataloader",
    "find_shared_parameters",
    "launch",
    "make_plan",
    "move_to_device",
    "prepare_dataloader",
    "replica_layout",
    "set_epoch",
    "snapshot",
]
