"""Text for the language-model examples: prepared datasets, small raw text, and token losses.

`data` is one of: empty (the Python standard library's sources, which every machine has),
a prepared dataset (a folder or `gs://` URL written by `prepare`: read by index, any size),
a text file or folder of text files (read whole, up to `max_bytes`: for small corpora), or
`hf:NAME[:COLUMN]`. JSON lines and Parquet are records, not text: they go through `prepare`.
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ..data import DataError, is_prepared
from ..data.encoding import IGNORE, Tokenizer
from ..data.sources import RECORD_FORMATS, builder_of, missing_datasets

Batch = dict[str, torch.Tensor]


def stdlib_corpus(max_bytes: int) -> bytes:
    """Concatenate sorted stdlib sources until `max_bytes` (deterministic on a given Python)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, size = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        size += len(data)
        if size >= max_bytes:
            break
    return b"".join(chunks)[:max_bytes]


def read_corpus(source: str, max_bytes: int) -> bytes:
    """Bytes of a text file, a folder of text files, or `hf:NAME[:COLUMN]` (read whole)."""
    if not source:
        return stdlib_corpus(max_bytes)
    if source.startswith("hf:"):
        try:
            from datasets import load_dataset
        except ImportError:
            raise DataError(missing_datasets(source)) from None
        name, _, column = source[3:].partition(":")
        try:
            rows = load_dataset(name, split="train")[column or "text"]
        except Exception as error:  # no network, no such dataset or column: one line
            first = (str(error).strip() or type(error).__name__).splitlines()[0][:300]
            raise DataError(f"cannot load {source}: {first}") from None
        return "\n".join(rows).encode()[:max_bytes]
    path = Path(source)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    if any(p.suffix == ".arrow" for p in files):
        raise DataError(
            f"{source!r} is not a whole prepared dataset (no prepared.json: a prepare that "
            "stopped early leaves none): run prepare again"
        )
    records = [str(p) for p in files if builder_of(str(p)) in RECORD_FORMATS]
    if records:
        raise DataError(
            f"{records[0]!r} holds records, not text: training on its raw bytes would learn "
            f"the JSON or Parquet itself. Prepare it first: prepare {source} --out DIR, then "
            "train with --data DIR"
        )
    return b"".join(p.read_bytes() for p in files)[:max_bytes]


def unigram_entropy(tokens: torch.Tensor, vocab: int) -> float:
    """Loss (nats/token) of the best model that ignores context: the baseline to beat."""
    counts = torch.bincount(tokens.long(), minlength=vocab).double()
    probs = counts[counts > 0] / counts.sum()
    return float(-(probs * probs.log()).sum())


class Windows(Dataset[Batch]):
    """Non-overlapping fixed-length windows of token ids: static shapes by construction."""

    def __init__(self, tokens: torch.Tensor, seq_len: int) -> None:
        self.tokens = tokens
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, index: int) -> Batch:
        start = index * self.seq_len
        chunk = self.tokens[start : start + self.seq_len + 1].long()
        return {"x": chunk[:-1], "y": chunk[1:]}


@dataclass
class TextSplits:
    """A text task's training and eval windows, and the context-free loss to beat."""

    train: Dataset[Batch]
    eval: Dataset[Batch]
    baseline: float


def text_splits(
    data: str, seq_len: int, max_bytes: int, eval_fraction: float, hf_tokenizer: Any, vocab: int
) -> TextSplits:
    """The windows `data` names (see the module's docstring), tokenized as the model reads."""
    tokenizer = Tokenizer(hf_tokenizer)
    if data and ("://" in data or is_prepared(data)):
        from ..data.reading import open_prepared

        train, held_out, manifest = open_prepared(data, seq_len, tokenizer.identity, vocab)
        return TextSplits(train, held_out, manifest.unigram_entropy)
    raw = read_corpus(data, max_bytes)
    if hf_tokenizer is None:
        tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    else:  # byte ids mean nothing to a pretrained model's embeddings
        text = raw.decode("utf-8", errors="replace")
        tokens = torch.tensor(tokenizer.encode([text])[0], dtype=torch.int32)
        if len(tokens) and int(tokens.max()) >= vocab:
            raise DataError(f"the tokenizer has ids beyond the model's vocabulary of {vocab}")
    if len(tokens) < 4 * (seq_len + 1):
        raise DataError(f"corpus {data!r} is too small: {len(tokens)} tokens")
    split = int(len(tokens) * (1 - eval_fraction))
    return TextSplits(
        Windows(tokens[:split], seq_len),
        Windows(tokens[split:], seq_len),
        unigram_entropy(tokens, vocab),
    )


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the targets that carry loss (-100 marks those that do not).

    A batch with none gives 0, not 0/0: a window of prompt tokens alone is possible.
    """
    per_token = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none")
    carried = (targets.flatten() != IGNORE).float()
    return (per_token * carried).sum() / carried.sum().clamp(min=1.0)


def token_metrics(logits: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-sample loss over the tokens that carry it, weighted by their count.

    The evaluator averages per-sample metrics by `weight`, so the eval loss is the mean over
    every loss-carrying token, as in training, whatever each sample's share of masked tokens.
    """
    from . import WEIGHT

    per_token = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")
    carried = (targets != IGNORE).float()
    count = carried.sum(dim=1)
    return {"loss": (per_token * carried).sum(dim=1) / count.clamp(min=1.0), WEIGHT: count}
