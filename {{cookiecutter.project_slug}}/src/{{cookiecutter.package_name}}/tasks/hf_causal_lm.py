"""Hugging Face causal language model: GPT-2 from `transformers`, with tied input/output embeddings.

By default the model is built from a config (no download) with a byte-level vocabulary of 256,
like the `lm` example. `model_name` starts from a pretrained GPT-2-architecture model instead:
its weights and its tokenizer must already be in the local Hugging Face cache (run
`hf download NAME` once where there is network access), or `model_name` is a local directory
written by `save_pretrained`. Nothing is downloaded at run time.

Data: by default the Python standard library's own source files (no download). `data` takes a
text file, a folder of text files, or `hf:NAME[:COLUMN]` for a Hugging Face dataset.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset
from transformers import AutoConfig, AutoTokenizer, GPT2Config, GPT2LMHeadModel
from transformers.models.gpt2.modeling_gpt2 import GPT2Block

from ..core.layers import BlockStack
from ._corpus import Windows, read_corpus, unigram_entropy

Batch = dict[str, torch.Tensor]

BYTE_VOCAB = 256  # the default vocabulary: bytes, no tokenizer needed
ARCHITECTURE_OPTIONS = ("dim", "layers", "heads", "dropout")  # fixed by a pretrained model


class GPT2CausalLM(GPT2LMHeadModel):
    """GPT-2 whose forward maps token ids to logits through one stack of blocks.

    Hugging Face's own forward calls each block with caches and masks; training needs none of
    them, so this forward runs embeddings -> blocks (hidden states in, hidden states out) ->
    final norm -> tied head, which lets the blocks be scanned. Parameter names are those of
    `GPT2LMHeadModel`: a state dict loads into it unchanged (for `generate()`, for instance).
    Causality comes from SDPA's `is_causal`, so the attention implementation is always "sdpa".
    `use_cache` is off: with it on, Hugging Face's forward appends to its key/value cache again
    when activation checkpointing recomputes a block, and the gradients come out wrong.
    """

    def __init__(self, config: GPT2Config) -> None:
        config._attn_implementation = "sdpa"
        config.use_cache = False
        super().__init__(config)
        self.transformer.h = BlockStack(self.transformer.h)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        body = self.transformer
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        hidden = body.drop(body.wte(input_ids) + body.wpe(positions))
        return self.lm_head(body.ln_f(body.h(hidden)))


def missing_from_cache(name: str, what: str) -> ValueError:
    return ValueError(
        f"model_name {name!r}: its {what} is not in the local Hugging Face cache and nothing is "
        f"downloaded at run time; run `hf download {name}` once with network access "
        "(or set model_name to a directory written by save_pretrained)"
    )


def load_pretrained_config(name: str) -> GPT2Config:
    """The config of a cached GPT-2-architecture model, or one clear ValueError."""
    try:
        config = AutoConfig.from_pretrained(name, local_files_only=True)
    except OSError:
        raise missing_from_cache(name, "config") from None
    if config.model_type != "gpt2":
        raise ValueError(
            f"model_name {name!r} is a {config.model_type!r} model; this task trains GPT-2 "
            "architecture models (write a task for others: docs/your-model.md)"
        )
    if config.scale_attn_by_inverse_layer_idx or config.add_cross_attention:
        raise ValueError(f"model_name {name!r}: its blocks are not identical GPT-2 blocks")
    return config  # type: ignore[no-any-return]


@dataclass
class HFCausalLMTask:
    name = "hf-causal-lm"
    block_class = GPT2Block
    data: str = ""
    model_name: str = ""
    seq_len: int = 64
    dim: int = 128
    layers: int = 2
    heads: int = 4
    dropout: float = 0.0
    max_bytes: int = 1_000_000
    eval_fraction: float = 0.05

    def __post_init__(self) -> None:
        raw = read_corpus(self.data, self.max_bytes)
        if self.model_name:
            self.config = load_pretrained_config(self.model_name)
            self.tokens = self._tokenize_pretrained(raw)
        else:
            self.config = GPT2Config(
                vocab_size=BYTE_VOCAB,
                n_positions=self.seq_len,
                n_embd=self.dim,
                n_layer=self.layers,
                n_head=self.heads,
                resid_pdrop=self.dropout,
                embd_pdrop=self.dropout,
                attn_pdrop=self.dropout,
                bos_token_id=None,
                eos_token_id=None,
                tie_word_embeddings=True,
            )
            self.tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        if self.seq_len > self.config.n_positions:
            raise ValueError(
                f"seq_len {self.seq_len} is longer than the model's {self.config.n_positions} "
                "positions"
            )
        if len(self.tokens) < 4 * (self.seq_len + 1):
            raise ValueError(f"corpus {self.data!r} is too small: {len(self.tokens)} tokens")
        self.baseline = unigram_entropy(self.tokens, self.config.vocab_size)

    @property
    def tokens_per_sample(self) -> int:
        return self.seq_len

    def _tokenize_pretrained(self, raw: bytes) -> torch.Tensor:
        """Token ids from the model's own tokenizer: byte ids mean nothing to its embeddings."""
        try:
            tokenizer = AutoTokenizer.from_pretrained(self.model_name, local_files_only=True)
        except OSError:
            raise missing_from_cache(self.model_name, "tokenizer") from None
        ids = tokenizer(raw.decode("utf-8", errors="replace"), verbose=False)["input_ids"]
        if max(ids, default=0) >= self.config.vocab_size:
            raise ValueError(
                f"model_name {self.model_name!r}: its tokenizer has ids beyond the model's "
                f"vocabulary of {self.config.vocab_size}"
            )
        return torch.tensor(ids, dtype=torch.int32)

    def build_model(self) -> nn.Module:
        if self.model_name:
            return GPT2CausalLM.from_pretrained(
                self.model_name, local_files_only=True, attn_implementation="sdpa"
            )
        return GPT2CausalLM(self.config)

    def _split(self) -> int:
        return int(len(self.tokens) * (1 - self.eval_fraction))

    def train_dataset(self) -> Dataset[Batch]:
        return Windows(self.tokens[: self._split()], self.seq_len)

    def eval_dataset(self) -> Dataset[Batch]:
        return Windows(self.tokens[self._split() :], self.seq_len)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        logits = model(batch["x"])
        return F.cross_entropy(logits.flatten(0, 1).float(), batch["y"].flatten())

    def metrics(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        logits = model(batch["x"]).float()
        per_token = F.cross_entropy(logits.transpose(1, 2), batch["y"], reduction="none")
        return {"loss": per_token.mean(dim=1)}

    def summarize(self, means: dict[str, float]) -> dict[str, float]:
        loss = means["loss"]
        return {**means, "perplexity": math.exp(min(loss, 50.0)), "baseline": self.baseline}


def make_task(data: str = "", **options: Any) -> HFCausalLMTask:
    fixed = [key for key in ARCHITECTURE_OPTIONS if key in options]
    if options.get("model_name") and fixed:
        raise ValueError(
            f"task option(s) {', '.join(fixed)} conflict with model_name: a pretrained model "
            "brings its own architecture; remove them from [task_options]"
        )
    return HFCausalLMTask(data=data, **options)
