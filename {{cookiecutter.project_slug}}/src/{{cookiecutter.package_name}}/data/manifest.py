"""The manifest of a prepared dataset: what it holds and how it was made, written last."""

from __future__ import annotations

import dataclasses
import json
import posixpath
from dataclasses import dataclass, field
from typing import Any

MANIFEST = "prepared.json"  # written after every data file: a folder without it is not whole
PLAN = "prepare-plan.json"  # written first: whose output this is, and its shards
INDEX = "index.json"  # in each split: where every window lies, so a reader opens no file to find it
FORMAT = "packed-token-windows"
VERSION = 2
SPLITS = ("train", "eval")


class DataError(ValueError):
    """Input that cannot be prepared or read; the message says what and where."""


@dataclass
class Manifest:
    """What training checks before it reads a prepared dataset, and the summary of `prepare`."""

    seq_len: int
    tokenizer: str  # "bytes", or the tokenizer's name and a hash of its vocabulary
    eod_id: int
    vocab_size: int  # ids are below this
    fingerprint: str  # of the inputs (names, sizes, dates) and every setting
    masked: bool = False  # a `labels` column marks the tokens that carry no loss (-100)
    documents: int = 0
    tokens: int = 0  # end-of-document tokens included
    sequences: dict[str, int] = field(default_factory=dict)
    dropped_tokens: int = 0  # the tails that did not fill a window
    loss_tokens: int = 0  # targets that carry loss (all of them without a mask)
    unigram_entropy: float = 0.0  # nats/token of the context-free baseline
    shards: int = 0  # each split holds one window file per shard, in shard order
    inputs: list[str] = field(default_factory=list)
    seconds: float = 0.0
    format: str = FORMAT
    version: int = VERSION

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def summary(self) -> str:
        """The closing line of `prepare`."""
        rate = self.tokens / self.seconds if self.seconds else 0.0
        share = self.loss_tokens / max(1, self.sequences_total * self.seq_len)
        masked = f", {share:.1%} of targets carry loss" if self.masked else ""
        return (
            f"{self.documents:,} documents, {self.tokens:,} tokens, {self.sequences['train']:,} "
            f"train + {self.sequences['eval']:,} eval sequences of {self.seq_len + 1}, "
            f"{self.dropped_tokens:,} tokens dropped{masked}; {self.seconds:.1f} s "
            f"({rate:,.0f} tokens/s)"
        )

    @property
    def sequences_total(self) -> int:
        return sum(self.sequences.values())


def join(base: str, *parts: str) -> str:
    return posixpath.join(base.rstrip("/"), *parts)


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of a path or URL, and the path within it."""
    import fsspec

    try:
        return fsspec.core.url_to_fs(url)  # type: ignore[no-any-return]
    except (ImportError, ValueError) as error:
        raise DataError(f"cannot open {url!r}: {str(error).splitlines()[0]}") from None


def read_manifest(location: str) -> Manifest | None:
    """The manifest of a prepared dataset at `location`, or None when there is none."""
    fs, path = filesystem(location)
    target = join(path, MANIFEST)
    try:
        if not fs.isfile(target):
            return None
        with fs.open(target, "r") as handle:
            data = json.load(handle)
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    return Manifest.from_dict(data)


def is_prepared(location: str) -> bool:
    """Whether `location` holds a whole prepared dataset."""
    return not location.startswith("hf:") and read_manifest(location) is not None
