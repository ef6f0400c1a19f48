"""TPU kernels behind plain functions: the grouped matmul of a mixture of experts.

TorchTPU's grouped matmul (`torch.tpu.ops.ragged_dot`) is experimental in 0.2 and cannot
run off a TPU; this backend offers none yet, so mixtures of experts take their path of
plain ops (`hf/experts.py`) on every device.
"""

from __future__ import annotations

import torch


def grouped_matmul_ready(tensor: torch.Tensor) -> bool:
    """False: no grouped matmul kernel is offered on this backend."""
    return False


def grouped_matmul(rows: torch.Tensor, weights: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Not offered on this backend (see `grouped_matmul_ready`)."""
    raise NotImplementedError("no grouped matmul kernel on torch_tpu: use the plain-op path")
