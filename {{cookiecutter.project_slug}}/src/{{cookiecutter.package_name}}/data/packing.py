"""Tokenized documents, concatenated in order and cut into fixed windows of `seq_len + 1` ids.

A shard's documents go through one `Packer`: each split keeps only its unfinished window
between batches, so memory does not grow with the shard. The ids of each split's last
unfinished window are dropped and counted, the same way for every shard.

The record layout of a window file is decided here and only here: `TOKEN_COLUMNS` lists
the per-token columns a window may carry (a column is a fixed-size list of `seq_len + 1`
int32 values), and a `SplitWriter` cuts every column it is given at the same places.

Every window records where its documents start: `positions` holds each token's position in
its document, counted from 0 at the document's first token and at the window's first (a
document that began in an earlier window is seen from where this one starts). Training
masks attention with it, so that no token reads a document it does not belong to.
"""

from __future__ import annotations

import base64
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .encoding import IGNORE
from .manifest import DataError

IDS, LABELS, POSITIONS = "input_ids", "labels", "positions"
TOKEN_COLUMNS = (IDS, LABELS, POSITIONS)  # in file order; a new per-token column is added here
STARTS = "starts"  # 1 at each document's first token: written as POSITIONS, window by window
FLUSH_IDS = 1 << 22  # ids gathered before windows are cut and written: few, large batches
WRITE_BYTES = 1 << 20  # a batch goes to its sink in writes of this size (an upload buffers them)
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # Arrow IPC: a message of no metadata


@dataclass
class SplitWriter:
    """Windows of one split, written to an Arrow stream as they fill; where each batch's
    columns lie in it (`layout`) is kept as they are written, so no one reads it back."""

    sink: BinaryIO
    window: int
    vocab: int
    pending: dict[str, list[np.ndarray]] = field(default_factory=dict)
    waiting: int = 0
    sequences: int = 0
    loss_tokens: int = 0
    counts: np.ndarray | None = None
    schema: Any = None
    written: int = 0  # bytes of the stream so far
    layout: list[dict[str, Any]] = field(default_factory=list)

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
        cut = {name: values[:whole] for name, values in joined.items()}
        if STARTS in cut:
            cut[POSITIONS] = window_positions(cut.pop(STARTS), self.window)
        self._write(cut)

    def _write(self, columns: dict[str, np.ndarray]) -> None:
        """One record batch, after the stream's schema if it is the first: the messages an
        Arrow stream writer writes, serialized here so that their layout is known."""
        import pyarrow as pa

        batch = pa.record_batch(
            {
                name: pa.FixedSizeListArray.from_arrays(
                    pa.array(columns[name], pa.int32()), self.window
                )
                for name in TOKEN_COLUMNS
                if name in columns
            }
        )
        if self.schema is None:
            self.schema = batch.schema
            self._emit(self.schema.serialize())
        if batch.num_rows:
            message = batch.serialize()
            self.layout.append(message_layout(message, self.schema, self.written))
            self._emit(message)

    def _emit(self, data: Any) -> None:
        view = memoryview(data)
        for at in range(0, len(view), WRITE_BYTES):
            self.sink.write(view[at : at + WRITE_BYTES])
        self.written += len(view)

    def close(self, masked: bool) -> int:
        """End the stream (one without windows holds the schema alone); return the ids
        dropped (the last unfinished window). The sink stays open: its owner publishes it."""
        if self.waiting >= self.window:
            self._flush()
        if self.schema is None:
            empty = np.zeros(0, np.int32)
            self._write({IDS: empty, **({LABELS: empty} if masked else {}), POSITIONS: empty})
        self._emit(END_OF_STREAM)
        return self.waiting


class Packer:
    """One shard's windows: a `train` and an `eval` stream, and what was packed."""

    def __init__(self, sinks: dict[str, BinaryIO], seq_len: int, vocab: int) -> None:
        self.splits = {
            name: SplitWriter(sinks[name], seq_len + 1, vocab) for name in ("train", "eval")
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
        starts = np.zeros(len(flat), np.int32)
        starts[np.cumsum(lengths)[:-1]] = 1  # every document's first token but the first's
        if len(flat):
            starts[0] = 1
        for name, take in (("train", ~held), ("eval", held)):
            if not take.any():
                continue
            # The documents of one split, still in corpus order, as one flat run of ids.
            keep = np.repeat(take, lengths)
            columns = {IDS: flat[keep], STARTS: starts[keep]}
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


def window_positions(starts: np.ndarray, window: int) -> np.ndarray:
    """Each token's position in its document within its window (flat, int32), from the
    markers of documents' first tokens: 0 at a marker and at every window's first token."""
    marked = starts.reshape(-1, window).astype(bool)
    index = np.arange(window, dtype=np.int32)
    last_start = np.maximum.accumulate(np.where(marked, index, 0), axis=1)
    return (index - last_start).astype(np.int32).ravel()


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
    """Where an Arrow stream file's windows lie, read from its batch headers: per record
    batch, its rows, the window width and the byte offset of each column's first value."""
    import mmap

    import pyarrow as pa

    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            return []
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    base = pa.py_buffer(mapped)
    batches = pa.ipc.open_stream(base).read_all().to_batches()
    return [_chunk(batch, base.address) for batch in batches if batch.num_rows]


def message_layout(message: Any, schema: Any, at: int) -> dict[str, Any]:
    """The layout of one serialized record batch (an IPC message) written at byte `at` of
    its stream, from the message itself: its body ends it."""
    import pyarrow as pa

    parsed = pa.ipc.read_message(message)
    body_at = at + message.size - parsed.body.size
    return _chunk(pa.ipc.read_record_batch(parsed, schema), parsed.body.address - body_at)


def _chunk(batch: Any, base: int) -> dict[str, Any]:
    """A batch's rows, window width and each column's first value, as an offset from the
    memory address `base` (where its stream's first byte is, or would be)."""
    offsets = {}
    for name in batch.schema.names:
        values = batch.column(name).flatten()
        if values.type != "int32" or batch.column(name).null_count or values.null_count:
            raise DataError("a prepared window column must hold int32 values without nulls")
        offsets[name] = int(values.buffers()[1].address + values.offset * 4 - base)
    return {"rows": batch.num_rows, "width": batch.column(IDS).type.list_size, "at": offsets}
