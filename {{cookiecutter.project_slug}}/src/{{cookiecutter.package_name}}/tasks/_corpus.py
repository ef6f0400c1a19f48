"""Text for the language-model examples: a corpus every machine has, and fixed windows."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch
from torch.utils.data import Dataset


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
    """Bytes of a text file, a folder of text files, or `hf:NAME[:COLUMN]`."""
    if not source:
        return stdlib_corpus(max_bytes)
    if source.startswith("hf:"):
        from datasets import load_dataset  # optional extra: pip install .[hf]

        name, _, column = source[3:].partition(":")
        rows = load_dataset(name, split="train")[column or "text"]
        return "\n".join(rows).encode()[:max_bytes]
    path = Path(source)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return b"".join(p.read_bytes() for p in files)[:max_bytes]


def unigram_entropy(tokens: torch.Tensor, vocab: int) -> float:
    """Loss (nats/token) of the best model that ignores context: the baseline to beat."""
    counts = torch.bincount(tokens.long(), minlength=vocab).double()
    probs = counts[counts > 0] / counts.sum()
    return float(-(probs * probs.log()).sum())


class Windows(Dataset[dict[str, torch.Tensor]]):
    """Non-overlapping fixed-length windows of token ids: static shapes by construction."""

    def __init__(self, tokens: torch.Tensor, seq_len: int) -> None:
        self.tokens = tokens
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start = index * self.seq_len
        chunk = self.tokens[start : start + self.seq_len + 1].long()
        return {"x": chunk[:-1], "y": chunk[1:]}
