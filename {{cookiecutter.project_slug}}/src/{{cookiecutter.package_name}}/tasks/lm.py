"""Character language model: a small GPT with tied input/output embeddings.

Data: by default the Python standard library's own source files, which every
machine with Python has (no download). `--data` takes a text file, a folder of
text files, or `hf:NAME[:COLUMN]` for a Hugging Face dataset.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..core.layers import BlockStack
from ..core.sharding import Rule
from ._corpus import Windows, read_corpus, unigram_entropy

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        # Head-major ([heads, q/k/v, head_dim]): split over `tensor`, each device keeps
        # whole heads with their own q, k and v.
        q, k, v = self.qkv(x).view(batch, length, self.heads, 3, dim // self.heads).unbind(3)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            is_causal=True,
            dropout_p=self.dropout if self.training else 0.0,
        )
        return self.out(y.transpose(1, 2).reshape(batch, length, dim))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class CharGPT(nn.Module):
    """Decoder-only transformer whose output projection is the input embedding."""

    def __init__(self, seq_len: int, dim: int, layers: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.position = nn.Parameter(torch.zeros(1, seq_len, dim))
        self.blocks = BlockStack(Block(dim, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied: the move to XLA must keep this
        nn.init.normal_(self.position, std=0.02)
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks(self.embed(x) + self.position)
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

    def __post_init__(self) -> None:
        raw = read_corpus(self.data, self.max_bytes)
        if len(raw) < 4 * (self.seq_len + 1):
            raise ValueError(f"corpus {self.data!r} is too small: {len(raw)} bytes")
        self.tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        self.split = int(len(self.tokens) * (1 - self.eval_fraction))
        self.baseline = unigram_entropy(self.tokens, VOCAB)

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

    def train_dataset(self) -> Windows:
        return Windows(self.tokens[: self.split], self.seq_len)

    def eval_dataset(self) -> Windows:
        return Windows(self.tokens[self.split :], self.seq_len)

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = model(batch["x"])
        return F.cross_entropy(logits.flatten(0, 1).float(), batch["y"].flatten())

    def metrics(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        logits = model(batch["x"]).float()
        per_token = F.cross_entropy(logits.transpose(1, 2), batch["y"], reduction="none")
        return {"loss": per_token.mean(dim=1)}

    def summarize(self, means: dict[str, float]) -> dict[str, float]:
        loss = means["loss"]
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "baseline": self.baseline}


def make_task(data: str = "", **options: object) -> LanguageModelTask:
    return LanguageModelTask(data=data, **options)  # type: ignore[arg-type]
