"""Documents to token ids: the task's Hugging Face tokenizer, or bytes; loss masks for fine-tuning.

Every document ends with an end-of-document id. With bytes that id is 255: a byte that valid
UTF-8 never holds (nor 0xC0, 0xC1, 0xF5-0xFE), so it cannot be mistaken for text and the
vocabulary stays 256. A Hugging Face tokenizer ends documents with its `eos_token_id`.
Fine-tuning records carry `labels`: the ids that carry loss, -100 (which `cross_entropy`
ignores by default) where the model only reads (the prompt, the user's turns).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from .manifest import DataError

BYTE_EOD = 255
BYTE_VOCAB = 256
IGNORE = -100  # F.cross_entropy's default ignore_index
GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # spreads the held-out documents evenly through the corpus

# What a record holds, from its fields: `text` mode reads the field `--field` names.
TEXT, PROMPT_COMPLETION, CHAT = "text", "prompt-completion", "chat"


@dataclass
class Tokenizer:
    """A tokenizer as `prepare` and training compare it: an identity, an end id, a vocabulary."""

    hf: Any = None  # a transformers tokenizer; None: bytes

    @property
    def identity(self) -> str:
        """`bytes`, or the tokenizer's name and a hash of everything that maps text to ids."""
        if self.hf is None:
            return "bytes"
        backend = getattr(self.hf, "backend_tokenizer", None)
        text = (
            backend.to_str()
            if backend is not None
            else json.dumps(sorted(self.hf.get_vocab().items()))
        )
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        name = str(getattr(self.hf, "name_or_path", "") or "tokenizer").rstrip("/")
        return f"{name.rsplit('/', 1)[-1]}#{digest}"

    @property
    def eod_id(self) -> int:
        if self.hf is None:
            return BYTE_EOD
        eos = self.hf.eos_token_id
        if eos is None:
            raise DataError("the tokenizer has no eos_token to end documents with: give it one")
        return int(eos)

    @property
    def size(self) -> int:
        """One past the largest id the tokenizer can give."""
        return BYTE_VOCAB if self.hf is None else len(self.hf)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        if self.hf is None:
            return [np.frombuffer(t.encode(), dtype=np.uint8).astype(np.int32) for t in texts]
        ids = self.hf(texts, add_special_tokens=False, verbose=False)["input_ids"]
        return [np.asarray(row, dtype=np.int32) for row in ids]


def same_identity(a: str, b: str) -> bool:
    """Two identities name the same tokenizer when their hashes agree (names may differ)."""
    return a.rsplit("#", 1)[-1] == b.rsplit("#", 1)[-1]


def mode_of(columns: list[str], field: str) -> str:
    """What the records are: chat `messages`, `prompt`/`completion` pairs, or text."""
    if field in columns:
        return TEXT
    if "messages" in columns:
        return CHAT
    if {"prompt", "completion"} <= set(columns):
        return PROMPT_COMPLETION
    return TEXT  # the field check names what is missing


def document_keys(texts: list[str]) -> np.ndarray:
    """A key per document from its content: a document falls in the same split wherever it
    lies, whatever the shards, the workers or the file format (and copies of it with it)."""
    digests = (hashlib.blake2b(t.encode(), digest_size=8).digest() for t in texts)
    return np.fromiter((int.from_bytes(d, "little") for d in digests), np.uint64, len(texts))


def held_out(keys: np.ndarray, fraction: float) -> np.ndarray:
    """Whether each document (by its key) belongs to the eval split: a fixed, even spread."""
    mixed = (keys.astype(np.uint64) + np.uint64(1)) * GOLDEN
    return (mixed >> np.uint64(11)).astype(np.float64) / float(1 << 53) < fraction


@dataclass
class Encoder:
    """What each shard runs over its batches of records (pickled into each worker)."""

    tokenizer: Tokenizer
    mode: str
    field: str
    eval_fraction: float

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, Any]:
        """Token ids (and labels) of a batch of records, and which are held out."""
        eod = self.tokenizer.eod_id
        out: dict[str, Any] = {"held_out": held_out(self.keys(batch), self.eval_fraction)}
        if self.mode == TEXT:
            texts = [t or "" for t in batch[self.field]]
            out["ids"] = [np.append(ids, np.int32(eod)) for ids in self.tokenizer.encode(texts)]
            return out
        pairs = (
            self._prompt_completion(batch) if self.mode == PROMPT_COMPLETION else self._chat(batch)
        )
        out["ids"] = [np.append(ids, np.int32(eod)) for ids, _ in pairs]
        out["labels"] = [np.append(labels, np.int32(eod)) for _, labels in pairs]
        return out

    def keys(self, batch: dict[str, list[Any]]) -> np.ndarray:
        """Each record's key, from its content."""
        if self.mode == TEXT:
            return document_keys([t or "" for t in batch[self.field]])
        if self.mode == PROMPT_COMPLETION:
            pairs = zip(batch["prompt"], batch["completion"], strict=True)
            return document_keys([f"{p or ''}\0{c or ''}" for p, c in pairs])
        return document_keys([json.dumps(m, sort_keys=True) for m in batch["messages"]])

    def _prompt_completion(self, batch: dict[str, list[Any]]) -> list[tuple[Any, Any]]:
        prompts = self.tokenizer.encode([p or "" for p in batch["prompt"]])
        completions = self.tokenizer.encode([c or "" for c in batch["completion"]])
        return [
            (np.concatenate([p, c]), np.concatenate([np.full(len(p), IGNORE, np.int32), c]))
            for p, c in zip(prompts, completions, strict=True)
        ]

    def _chat(self, batch: dict[str, list[Any]]) -> list[tuple[Any, Any]]:
        """The chat template's rendering; loss on what each assistant turn adds to it."""
        hf = self.tokenizer.hf
        if hf is None or not getattr(hf, "chat_template", None):
            raise DataError(
                "chat `messages` need a tokenizer with a chat template: set the task's "
                "model_name to a model whose tokenizer has one"
            )
        pairs = []
        for messages in batch["messages"]:
            ids = self._rendered(messages, len(messages))
            labels = np.full(len(ids), IGNORE, np.int32)
            for turn, message in enumerate(messages):
                if message.get("role") != "assistant":
                    continue
                start = len(self._rendered(messages, turn, reply=True))
                end = len(self._rendered(messages, turn + 1))
                labels[start:end] = ids[start:end]
            pairs.append((ids, labels))
        return pairs

    def _rendered(self, messages: list[Any], turns: int, reply: bool = False) -> np.ndarray:
        """The ids of the first `turns` messages through the chat template."""
        text = self.tokenizer.hf.apply_chat_template(
            messages[:turns], tokenize=False, add_generation_prompt=reply
        )
        return self.tokenizer.encode([text])[0]
