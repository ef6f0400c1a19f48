"""What every part of the `hf` package needs: its error, and the `transformers` model inside."""

from __future__ import annotations

import sys
from typing import Any

from torch import nn


class HFConfigError(ValueError):
    """A Hugging Face model, tokenizer or LoRA request that cannot run; the message says why."""


def unwrap(model: nn.Module) -> Any:
    """The `transformers` model inside `model` (itself, or the one peft wraps), else None."""
    transformers = sys.modules.get("transformers")
    if transformers is None:  # never imported: no model can come from it
        return None
    for module in model.modules():
        if isinstance(module, transformers.PreTrainedModel):
            return module
    return None


def is_hf_model(model: nn.Module) -> bool:
    return unwrap(model) is not None
