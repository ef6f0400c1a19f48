"""Hugging Face causal language model: any decoder `transformers` builds, trained as is.

`architecture = "llama"` (or qwen2, gemma, mistral, gpt2, phi3, ...) builds a model of that
architecture from a config with the size options below (`config_fields` sets any other
field of its config): no download, a byte-level vocabulary of 256 like the `lm` example. A
mixture of experts (mixtral, qwen2_moe, qwen3_moe, olmoe, llama4_text, ...) takes `experts`
and `experts_per_token` too; its training loss includes its router's load-balancing loss
where the model defines one. `model_name` starts from a pretrained model
instead: its weights and its tokenizer must already be in the local Hugging Face cache (run
`hf download NAME` once where there is network access), or `model_name` is a local
directory written by `save_pretrained`. Nothing is downloaded at run time.

The model runs its own forward. What training on XLA needs beyond that (masks without
device reads, attention inside each document and the flash kernel on TPU, no key/value
cache, the decoder layer fsdp wraps, LoRA) the project does for every `transformers` model
(`hf/`), so a task of your own gets it too: pass the batch's `positions` as `position_ids`.

Data: by default the Python standard library's own source files (no download). `data` takes a
prepared dataset (`prepare`, tokenized with this task's tokenizer: any size, local or gs://), a
small text file or folder of text files, or `hf:NAME[:COLUMN]` for a Hugging Face dataset.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from ..hf import HFConfigError
from ..hf.byte_tokenizer import BYTE_VOCAB
from ..hf.models import Sizes, build_decoder, decoder_config, load_decoder
from ..hf.moe import add_router_loss
from ..weights.locations import pretrained_config, pretrained_tokenizer
from ..weights.meta import building_on_meta
from . import POSITIONS
from ._corpus import TextSplits, text_splits, token_loss, token_metrics

Batch = dict[str, torch.Tensor]

# Options that shape a model built from a config; a pretrained model brings its own.
ARCHITECTURE_OPTIONS = ("architecture", "dim", "layers", "heads", "kv_heads", "mlp_dim",
                        "dropout", "tie_embeddings", "experts", "experts_per_token",
                        "config_fields")  # fmt: skip


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
    experts: int = 0  # a mixture of experts' experts per layer (0: the architecture's)
    experts_per_token: int = 0  # 0: the architecture's
    # Fields of the architecture's transformers config, set over the sizes above (a table:
    # Llama 4's interleave_moe_layer_step, a sliding_window).
    config_fields: dict[str, Any] = field(default_factory=dict)
    max_bytes: int = 1_000_000
    eval_fraction: float = 0.05

    def __post_init__(self) -> None:
        self.tokenizer: Any = None
        if self.model_name:  # checked before any data is read
            self.config = pretrained_config(self.model_name)
            self.tokenizer = pretrained_tokenizer(self.model_name)
        else:
            self.config = decoder_config(self.architecture, self.sizes, self.config_fields)
        positions = getattr(self.config, "max_position_embeddings", None)
        if positions is not None and self.seq_len > positions:
            raise HFConfigError(
                f"seq_len {self.seq_len} is longer than the model's {positions} positions"
            )
        if self.data:
            self.splits  # noqa: B018  (refuse data made for another run before any weights load)

    @cached_property
    def splits(self) -> TextSplits:
        """Read when first needed: `prepare` builds the task only for its tokenizer."""
        return text_splits(
            self.data, self.seq_len, self.max_bytes, self.eval_fraction, self.tokenizer,
            self.vocab_size,
        )  # fmt: skip

    @property
    def baseline(self) -> float:
        return self.splits.baseline

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def sizes(self) -> Sizes:
        return Sizes(
            BYTE_VOCAB, self.seq_len, self.dim, self.layers, self.heads, self.kv_heads,
            self.mlp_dim, self.dropout, self.tie_embeddings, self.experts, self.experts_per_token,
        )  # fmt: skip

    @property
    def tokens_per_sample(self) -> int:
        return self.seq_len

    @property
    def pretrained_weights(self) -> str:
        """Where the model's pretrained safetensors are (empty: none): a run builds the
        model from its config on the meta device and reads each shard from there."""
        return self.model_name

    def build_model(self) -> nn.Module:
        if self.model_name and not building_on_meta():
            return load_decoder(self.model_name)  # whole, for use outside a run
        return build_decoder(self.config)

    def train_dataset(self) -> Dataset[Batch]:
        return self.splits.train

    def eval_dataset(self) -> Dataset[Batch]:
        return self.splits.eval

    def logits(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return model(input_ids=batch["x"], position_ids=batch.get(POSITIONS)).logits  # type: ignore[no-any-return]

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        # Positions that restart at each document keep attention inside it (no positions:
        # the window is one text).
        output = model(input_ids=batch["x"], position_ids=batch.get(POSITIONS))
        loss = token_loss(output.logits, batch["y"])  # -100 carries no loss
        return add_router_loss(loss, model, output)  # a mixture of experts' balancing loss

    def metrics(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        return token_metrics(self.logits(model, batch), batch["y"])

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
