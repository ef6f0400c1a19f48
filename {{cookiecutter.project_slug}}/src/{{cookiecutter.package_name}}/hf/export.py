"""A trained decoder's files in the Hugging Face layout besides its weights (config, generation
config, tokenizer), and a LoRA adapter alone. The weights themselves are written a tensor at a
time by `weights/export.py`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from .byte_tokenizer import BYTE_VOCAB, byte_tokenizer
from .common import unwrap


def save_model_files(inner: Any, tokenizer: Any, folder: Path) -> None:
    """What `save_pretrained` writes beside the weights of `inner` (a transformers model, on
    the meta device or not), and the tokenizer: the model's own, or for a byte vocabulary
    without one, the byte tokenizer its ids mean."""
    from transformers.dynamic_module_utils import custom_object_save

    config = inner.config
    config.use_cache = True  # training turned it off; generation wants it
    config.dtype = str(inner.dtype).split(".")[1]  # as save_pretrained records it
    config.architectures = [type(inner).__name__]
    if inner.is_remote_code():
        custom_object_save(inner, str(folder), config=config)
    config.save_pretrained(str(folder))
    if inner.can_generate():
        inner.generation_config.save_pretrained(str(folder))
    save_tokenizer(inner, tokenizer, folder)


def save_tokenizer(inner: Any, tokenizer: Any, folder: Path) -> None:
    if tokenizer is None and inner.config.vocab_size == BYTE_VOCAB:
        tokenizer = byte_tokenizer()
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))


def save_adapter(model: nn.Module, tokenizer: Any, folder: Path) -> None:
    """A LoRA model's adapter alone (adapter_config.json, adapter_model.safetensors: what
    `peft` loads onto the base), with the tokenizer, into `folder`."""
    model.save_pretrained(str(folder))  # type: ignore[operator]
    save_tokenizer(unwrap(model), tokenizer, folder)
