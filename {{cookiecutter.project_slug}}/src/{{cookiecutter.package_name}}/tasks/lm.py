"""Character language model: a small GPT with tied input/output embeddings.

Attention stays inside each document of a prepared dataset's windows (`positions`: the
blocks take the documents' segments, the position embedding counts from each document's
start), through `core.attention`: the Pallas flash kernel on TPU, SDPA elsewhere.

Data: by default the Python standard library's own source files, which every
machine with Python has (no download). `--data` takes a prepared dataset (`prepare`:
JSON lines, Parquet or text of any size, local or gs://), a small text file or
folder of text files, or `hf:NAME[:COLUMN]` for a Hugging Face dataset.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from ..core.attention import causal_attention, document_segments
from ..core.layers import BlockStack
from ..core.sharding import Rule
from . import POSITIONS
from ._corpus import TextSplits, text_splits, token_loss, token_metrics

VOCAB = 256  # bytes: every text has a vocabulary, no tokenizer needed
# Tensor parallelism for the blocks (Megatron's layout): attention's qkv and the first MLP
# layer split their outputs over `tensor`, the layers after them their inputs, so each
# block needs one all-reduce. Other weights follow the fsdp rule.
SHARDING_RULES = [
    Rule("blocks.*.attn.qkv.weight", ("tensor", "fsdp")),
    Rule("blocks.*.attn.qkv.bias", ("tensor",)),
    Rule("blocks.*.attn.out.weight", ("fsdp", "tensor")),
    Rule("blocks.*.mlp.0.weight", ("tensor", "fsdp")),
    Rule("blocks.*.mlp.0.bias", ("tensor",)),
    Rule("blocks.*.mlp.2.weight", ("fsdp", "tensor")),
]


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, segments: torch.Tensor | None = None) -> torch.Tensor:
        batch, length, dim = x.shape
{%- if cookiecutter.backend == "torch_tpu" %}
        # Head-major ([heads, q/k/v, head_dim]): split over `tensor`, each device keeps
        # whole heads with their own q, k and v: -1 heads, as many as this device holds.
        q, k, v = self.qkv(x).view(batch, length, -1, 3, dim // self.heads).unbind(3)
{%- else %}
        # Head-major ([heads, q/k/v, head_dim]): split over `tensor`, each device keeps
        # whole heads with their own q, k and v.
        q, k, v = self.qkv(x).view(batch, length, self.heads, 3, dim // self.heads).unbind(3)
{%- endif %}
        y = causal_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            segments,
            dropout=self.dropout if self.training else 0.0,
        )
{%- if cookiecutter.backend == "torch_tpu" %}
        return self.out(y.transpose(1, 2).reshape(batch, length, -1))
{%- else %}
        return self.out(y.transpose(1, 2).reshape(batch, length, dim))
{%- endif %}


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, segments: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), segments)
        return x + self.mlp(self.norm2(x))


class TokenEmbedding(nn.Embedding):
    """Token embeddings drawn with std 0.02 (the output head reuses them)."""

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=0.02)


class CharGPT(nn.Module):
    """Decoder-only transformer whose output projection is the input embedding."""

    def __init__(self, seq_len: int, dim: int, layers: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.embed = TokenEmbedding(VOCAB, dim)
        self.position = nn.Parameter(torch.empty(1, seq_len, dim))
        self.blocks = BlockStack(Block(dim, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied: the move to XLA must keep this
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Its own parameters (each module sets its own: a model built on the meta device
        is initialized module by module)."""
        nn.init.normal_(self.position, std=0.02)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of `x` [batch, tokens]; with `positions` (each token's position in its
        document), every document read as if alone."""
        if positions is None:
            h = self.blocks(self.embed(x) + self.position[:, : x.shape[1]])
        else:
            placed = F.embedding(positions, self.position[0])
            h = self.blocks(self.embed(x) + placed, document_segments(positions))
        return self.head(self.norm(h))


@dataclass
class LanguageModelTask:
    name = "lm"
    block_class = Block
    sharding_rules = SHARDING_RULES
    data: str = ""
    seq_len: int = 64
    dim: int = 128
    layers: int = 2
    heads: int = 4
    dropout: float = 0.0
    max_bytes: int = 1_000_000
    eval_fraction: float = 0.05

    tokenizer = None  # bytes: the vocabulary is VOCAB
    vocab_size = VOCAB

    def __post_init__(self) -> None:
        if self.data:
            self.splits  # noqa: B018  (refuse data made for another run before anything starts)

    @cached_property
    def splits(self) -> TextSplits:
        """Read when first needed: `prepare` builds the task only for its tokenizer."""
        return text_splits(self.data, self.seq_len, self.max_bytes, self.eval_fraction, None, VOCAB)

    @property
    def baseline(self) -> float:
        return self.splits.baseline

    @property
    def tokens_per_sample(self) -> int:
        return self.seq_len

    def check_mesh(self, axes: dict[str, int]) -> None:
        """Each device must hold whole attention heads."""
        tensor = axes.get("tensor", 1)
        if self.heads % tensor:
            raise ValueError(
                f"tensor={tensor} does not divide the model's {self.heads} attention heads "
                "(task option heads)"
            )

    def build_model(self) -> nn.Module:
        return CharGPT(self.seq_len, self.dim, self.layers, self.heads, self.dropout)

    def train_dataset(self) -> Dataset[dict[str, torch.Tensor]]:
        return self.splits.train

    def eval_dataset(self) -> Dataset[dict[str, torch.Tensor]]:
        return self.splits.eval

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = model(batch["x"], batch.get(POSITIONS))  # documents, when the data has them
        return token_loss(logits, batch["y"])  # targets of -100 carry no loss

    def metrics(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return token_metrics(model(batch["x"], batch.get(POSITIONS)), batch["y"])

    def summarize(self, means: dict[str, float]) -> dict[str, float]:
        loss = means["loss"]
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "baseline": self.baseline}


def make_task(data: str = "", **options: object) -> LanguageModelTask:
    return LanguageModelTask(data=data, **options)  # type: ignore[arg-type]
