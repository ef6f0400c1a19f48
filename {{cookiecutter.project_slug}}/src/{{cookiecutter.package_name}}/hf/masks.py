"""Attention masks without device reads, for every `transformers` decoder on XLA.

transformers builds each forward's attention mask with checks that branch on tensor
values: with no attention mask, `find_packed_sequence_indices` asks whether the
position ids hold several packed sequences, `(mask[:, -1] == 0).all()`; with one, SDPA's
mask skipping asks `padding_mask.all()`. On an XLA tensor each such branch reads the
device: the step's graph is cut in two and the host waits for the device, every step.
transformers skips these checks while a graph is traced (`torch.compile`, `torch.export`)
and builds the mask from the tensors instead, which is always correct. An XLA lazy tensor
is a traced graph too: `static_masks()` makes transformers' mask code say so.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ..core import ops

_PATCHED = "_xla_static_masks"


def _xla_aware(is_tracing: Callable[..., bool]) -> Callable[..., bool]:
    @functools.wraps(is_tracing)  # keeps transformers' own check as __wrapped__
    def traced(tensor: Any = None) -> bool:
        # Meta tensors (FLOPs are counted on the meta device) have no values to read either.
        if isinstance(tensor, torch.Tensor) and (
            tensor.device.type == "meta" or ops.traced_lazily(tensor)
        ):
            return True
        return bool(is_tracing(tensor))

    setattr(traced, _PATCHED, True)
    return traced


def static_masks() -> None:
    """Treat XLA tensors as traced in transformers' mask code (idempotent, process-wide)."""
    from transformers import masking_utils

    if not getattr(masking_utils.is_tracing, _PATCHED, False):
        masking_utils.is_tracing = _xla_aware(masking_utils.is_tracing)
