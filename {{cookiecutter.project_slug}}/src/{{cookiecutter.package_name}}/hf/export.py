"""A trained decoder in the Hugging Face layout: config, safetensors (sharded with an index
above `max_shard_size`), generation config and tokenizer files; or a LoRA adapter alone."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from torch import nn

from .byte_tokenizer import BYTE_VOCAB, byte_tokenizer
from .common import HFConfigError, unwrap
from .lora import is_lora


def save_hf(model: nn.Module, tokenizer: Any, out: Path, max_shard_size: str = "5GB") -> None:
    """Write `model` (a transformers model, or a peft model: its adapter alone) to `out`.

    With the model's tokenizer; a model of a byte vocabulary and no tokenizer gets the
    byte tokenizer its ids mean.
    Written into a scratch folder beside `out` and moved into place when whole, so an
    interrupted export leaves nothing that looks like a model. An existing, non-empty
    `out` is refused rather than overwritten.
    """
    inner = unwrap(model)
    if inner is None:
        raise HFConfigError(
            f"the model is a {type(model).__name__}, not a Hugging Face transformers model: "
            "export it with --format safetensors"
        )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise HFConfigError(f"--out {str(out)!r} exists and is not empty: choose a new directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as scratch:
        partial = Path(scratch) / "model"
        if is_lora(model):  # the adapter alone: adapter_config.json, adapter_model.safetensors
            model.save_pretrained(str(partial))  # type: ignore[operator]
        else:
            inner.config.use_cache = True  # training turned it off; generation wants it
            inner.save_pretrained(str(partial), max_shard_size=max_shard_size)
        if tokenizer is None and inner.config.vocab_size == BYTE_VOCAB:
            tokenizer = byte_tokenizer()
        if tokenizer is not None:
            tokenizer.save_pretrained(str(partial))
        if out.exists():
            out.rmdir()  # empty, checked above
        partial.rename(out)
