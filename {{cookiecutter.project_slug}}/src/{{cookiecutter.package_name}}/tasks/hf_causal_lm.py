"""Hugging Face causal language model: any decoder `transformers` builds, trained as is.

`architecture = "llama"` (or qwen2, gemma, mistral, gpt2, phi3, ...) builds a model of that
architecture from a config with the size options below: no download, a byte-level
vocabulary of 256 like the `lm` example. `model_name` starts from a pretrained model
instead: its weights and its tokenizer must already be in the local Hugging Face cache (run
`hf download NAME` once where there is network access), or `model_name` is a local
directory written by `save_pretrained`. Nothing is downloaded at run time.

The model runs its own forward. What training on XLA needs beyond that (masks without
device reads, no key/value cache, the decoder layer fsdp wraps, LoRA) the project does for
every `transformers` model (`hf/`), so a task of your own gets it too.

Data: by default the Python standard library's own source files (no download). `data` takes a
text file, a folder of text files, or `hf:NAME[:COLUMN]` for a Hugging Face dataset.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from ..hf import HFConfigError
from ..hf.byte_tokenizer import BYTE_VOCAB
from ..hf.models import (
    Sizes,
    build_decoder,
    decoder_config,
    load_decoder,
    load_tokenizer,
    pretrained_config,
)
from ._corpus import Windows, read_corpus, unigram_entropy

Batch = dict[str, torch.Tensor]

# Options that shape a model built from a config; a pretrained model brings its own.
ARCHITECTURE_OPTIONS = ("architecture", "dim", "layers", "heads", "kv_heads", "mlp_dim",
                        "dropout", "tie_embeddings")  # fmt: skip


@dataclass
class HFCausalLMTask:
    name = "hf-causal-lm"
    data: str = ""
    model_name: str = ""
    architecture: str = "llama"
    seq_len: int = 64
    dim: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 0  # 0: as many as heads
    mlp_dim: int = 0  # 0: 4 x dim
    dropout: float = 0.0
    tie_embeddings: bool | None = None  # None: the architecture's default
    max_bytes: int = 1_000_000
    eval_fraction: float = 0.05

    def __post_init__(self) -> None:
        self.tokenizer: Any = None
        if self.model_name:  # checked before any data is read
            self.config = pretrained_config(self.model_name)
            self.tokenizer = load_tokenizer(self.model_name)
        else:
            self.config = decoder_config(self.architecture, self.sizes)
        raw = read_corpus(self.data, self.max_bytes)
        if self.tokenizer is not None:
            self.tokens = self._tokenize_pretrained(raw)
        else:
            self.tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        positions = getattr(self.config, "max_position_embeddings", None)
        if positions is not None and self.seq_len > positions:
            raise HFConfigError(
                f"seq_len {self.seq_len} is longer than the model's {positions} positions"
            )
        if len(self.tokens) < 4 * (self.seq_len + 1):
            raise ValueError(f"corpus {self.data!r} is too small: {len(self.tokens)} tokens")
        self.baseline = unigram_entropy(self.tokens, self.vocab_size)

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def sizes(self) -> Sizes:
        return Sizes(
            BYTE_VOCAB, self.seq_len, self.dim, self.layers, self.heads, self.kv_heads,
            self.mlp_dim, self.dropout, self.tie_embeddings,
        )  # fmt: skip

    @property
    def tokens_per_sample(self) -> int:
        return self.seq_len

    def _tokenize_pretrained(self, raw: bytes) -> torch.Tensor:
        """Token ids from the model's own tokenizer: byte ids mean nothing to its embeddings."""
        text = raw.decode("utf-8", errors="replace")
        ids = self.tokenizer(text, verbose=False)["input_ids"]
        if max(ids, default=0) >= self.vocab_size:
            raise HFConfigError(
                f"model_name {self.model_name!r}: its tokenizer has ids beyond the model's "
                f"vocabulary of {self.vocab_size}"
            )
        return torch.tensor(ids, dtype=torch.int32)

    def build_model(self) -> nn.Module:
        if self.model_name:
            return load_decoder(self.model_name)
        return build_decoder(self.config)

    def _split(self) -> int:
        return int(len(self.tokens) * (1 - self.eval_fraction))

    def train_dataset(self) -> Dataset[Batch]:
        return Windows(self.tokens[: self._split()], self.seq_len)

    def eval_dataset(self) -> Dataset[Batch]:
        return Windows(self.tokens[self._split() :], self.seq_len)

    def logits(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return model(input_ids=batch["x"]).logits  # type: ignore[no-any-return]

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        logits = self.logits(model, batch)
        return F.cross_entropy(logits.flatten(0, 1).float(), batch["y"].flatten())

    def metrics(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        logits = self.logits(model, batch).float()
        per_token = F.cross_entropy(logits.transpose(1, 2), batch["y"], reduction="none")
        return {"loss": per_token.mean(dim=1)}

    def summarize(self, means: dict[str, float]) -> dict[str, float]:
        loss = means["loss"]
        return {**means, "perplexity": math.exp(min(loss, 50.0)), "baseline": self.baseline}


def make_task(data: str = "", **options: Any) -> HFCausalLMTask:
    fixed = [key for key in ARCHITECTURE_OPTIONS if key in options]
    if options.get("model_name") and fixed:
        raise HFConfigError(
            f"task option(s) {', '.join(fixed)} conflict with model_name: a pretrained model "
            "brings its own architecture; remove them from [task_options]"
        )
    known = {f.name for f in fields(HFCausalLMTask)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise HFConfigError(
            f"task 'hf-causal-lm' has no option {unknown[0]!r}: it takes {', '.join(sorted(known))}"
        )
    return HFCausalLMTask(data=data, **options)
