"""Tokenized documents, concatenated in order and cut into fixed windows of `seq_len + 1` ids.

A shard's documents go through one `Packer`: each split keeps only its unfinished window
between batches, so memory does not grow with the shard. The ids of each split's last
unfinished window are dropped and counted, the same way for every shard.

The record layout of a window file is decided here and only here: `TOKEN_COLUMNS` lists
the per-token columns a window may carry (a column is a fixed-size list of `seq_len + 1`
int32 values), and a `SplitWriter` cuts every column it is given at the same places.
"""

from __future__ import annotations

import base64
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .encoding import IGNORE
from .manifest import DataError

IDS, LABELS = "input_ids", "labels"
TOKEN_COLUMNS = (IDS, LABELS)  # in file order; a new per-token column is added here
FLUSH_IDS = 1 << 22  # ids gathered before windows are cut and written: few, large batches


@dataclass
class SplitWriter:
    """Windows of one split, written to an Arrow stream file as they fill."""

    path: Path
    window: int
    vocab: int
    pending: dict[str, list[np.ndarray]] = field(default_factory=dict)
    waiting: int = 0
    sequences: int = 0
    loss_tokens: int = 0
    counts: np.ndarray | None = None
    writer: Any = None

    def add(self, columns: dict[str, np.ndarray]) -> None:
        """Append one run of tokens: `columns[IDS]` and any other per-token column."""
        for name, values in columns.items():
            self.pending.setdefault(name, []).append(values)
        self.waiting += len(columns[IDS])
        if self.waiting >= max(self.window, FLUSH_IDS):
            self._flush()

    def _flush(self) -> None:
        joined = {name: np.concatenate(parts) for name, parts in self.pending.items()}
        whole = len(joined[IDS]) // self.window * self.window
        if LABELS in joined:
            targets = joined[LABELS][:whole].reshape(-1, self.window)[:, 1:]
            self.loss_tokens += int((targets != IGNORE).sum())
        else:
            self.loss_tokens += whole // self.window * (self.window - 1)
        counts = np.bincount(joined[IDS][:whole], minlength=self.vocab)
        self.counts = counts if self.counts is None else self.counts + counts
        self.pending = {name: [values[whole:]] for name, values in joined.items()}
        self.waiting -= whole
        self.sequences += whole // self.window
        self._write({name: values[:whole] for name, values in joined.items()})

    def _write(self, columns: dict[str, np.ndarray]) -> None:
        import pyarrow as pa

        table = pa.table(
            {
                name: pa.FixedSizeListArray.from_arrays(
                    pa.array(columns[name], pa.int32()), self.window
                )
                for name in TOKEN_COLUMNS
                if name in columns
            }
        )
        if self.writer is None:
            self.writer = pa.ipc.new_stream(str(self.path), table.schema)
        if table.num_rows:
            self.writer.write_table(table)

    def close(self, masked: bool) -> int:
        """Close the file (a file without windows holds the schema alone); return the ids
        dropped (the last unfinished window)."""
        if self.waiting >= self.window:
            self._flush()
        if self.writer is None:
            empty = np.zeros(0, np.int32)
            self._write({IDS: empty, **({LABELS: empty} if masked else {})})
        self.writer.close()
        return self.waiting


class Packer:
    """One shard's windows: `train` and `eval` files in a folder, and what was packed."""

    def __init__(self, folder: Path, seq_len: int, vocab: int) -> None:
        self.splits = {
            name: SplitWriter(folder / f"{name}.arrow", seq_len + 1, vocab)
            for name in ("train", "eval")
        }
        self.vocab = vocab
        self.documents = self.tokens = 0

    def add(self, ids: list[np.ndarray], labels: list[np.ndarray] | None, held: np.ndarray) -> None:
        """Add a batch of documents in corpus order; `held` marks those of the eval split."""
        lengths = np.fromiter((len(d) for d in ids), np.int64, len(ids))
        flat = np.concatenate(ids) if ids else np.zeros(0, np.int32)
        if len(flat) and int(flat.max()) >= self.vocab:
            raise DataError(
                f"the tokenizer gives id {int(flat.max())}, beyond the model's vocabulary of "
                f"{self.vocab}: use the model's own tokenizer"
            )
        flat_labels = np.concatenate(labels) if labels else None
        for name, take in (("train", ~held), ("eval", held)):
            if not take.any():
                continue
            # The documents of one split, still in corpus order, as one flat run of ids.
            keep = np.repeat(take, lengths)
            columns = {IDS: flat[keep]}
            if flat_labels is not None:
                columns[LABELS] = flat_labels[keep]
            self.splits[name].add(columns)
        self.documents += len(ids)
        self.tokens += len(flat)

    def close(self, masked: bool) -> dict[str, Any]:
        dropped = sum(writer.close(masked) for writer in self.splits.values())
        counts = sum(w.counts for w in self.splits.values() if w.counts is not None)
        return {
            "documents": self.documents,
            "tokens": self.tokens,
            "dropped_tokens": dropped,
            "sequences": {name: writer.sequences for name, writer in self.splits.items()},
            "loss_tokens": sum(writer.loss_tokens for writer in self.splits.values()),
            "counts": encode_counts(counts if isinstance(counts, np.ndarray) else None),
            "masked": masked,
        }


def encode_counts(counts: np.ndarray | None) -> str:
    """Token counts as text: the ids seen and their counts, compressed."""
    if counts is None:
        return ""
    seen = np.flatnonzero(counts).astype(np.uint32)
    packed = seen.tobytes() + counts[seen].astype(np.int64).tobytes()
    return base64.b64encode(zlib.compress(packed)).decode()


def decode_counts(text: str, vocab: int) -> np.ndarray:
    counts = np.zeros(vocab, np.int64)
    if text:
        packed = zlib.decompress(base64.b64decode(text))
        seen = np.frombuffer(packed, np.uint32, len(packed) // 12)
        counts[seen] = np.frombuffer(packed, np.int64, offset=len(seen) * 4)
    return counts


def entropy(counts: np.ndarray) -> float:
    """Loss (nats/token) of the best model that ignores context."""
    if counts.sum() == 0:
        return 0.0
    probs = counts[counts > 0] / counts.sum()
    return float(-(probs * np.log(probs)).sum())


def file_layout(path: Path) -> list[dict[str, Any]]:
    """Where an Arrow stream file's windows lie, from its batch headers: per record batch,
    its rows, the window width and the byte offset of each column's first value."""
    import mmap

    import pyarrow as pa

    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            return []
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    base = pa.py_buffer(mapped)
    chunks = []
    for batch in pa.ipc.open_stream(base).read_all().to_batches():
        if batch.num_rows == 0:
            continue
        offsets = {}
        for name in batch.schema.names:
            values = batch.column(name).flatten()
            if values.type != "int32" or batch.column(name).null_count or values.null_count:
                raise DataError("a prepared window column must hold int32 values without nulls")
            offsets[name] = int(values.buffers()[1].address + values.offset * 4 - base.address)
        width = batch.column(IDS).type.list_size
        chunks.append({"rows": batch.num_rows, "width": width, "at": offsets})
    return chunks
