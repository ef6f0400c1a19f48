"""Generation from a trained or pretrained model where it trained: a static key/value cache,
one compiled prefill per prompt-length bucket and one compiled decode step (`engine.py`),
sampling on the device (`sampling.py`), the model laid out as training lays it out
(`model.py`), prompts in and completions out (`prompts.py`), and the `generate` command."""

from __future__ import annotations

from .engine import Completion, Engine, GenerationError, Shape
from .sampling import Sampling

__all__ = ["Completion", "Engine", "GenerationError", "Sampling", "Shape"]
