"""Tokenized documents, concatenated in order and cut into fixed windows of `seq_len + 1` ids.

One sequential pass over the memory-mapped tokenized documents: each split keeps only its
unfinished window between batches, so memory does not grow with the corpus. The ids of the
last unfinished window of each split are dropped and counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .encoding import IGNORE
from .manifest import DataError

FLUSH_IDS = 1 << 22  # ids gathered before windows are cut and written: few, large batches


@dataclass
class SplitWriter:
    """Windows of one split, written to an Arrow stream file as they fill."""

    path: Path
    window: int
    masked: bool
    vocab: int
    pending_ids: list[np.ndarray] = field(default_factory=list)
    pending_labels: list[np.ndarray] = field(default_factory=list)
    pending: int = 0
    sequences: int = 0
    loss_tokens: int = 0
    counts: np.ndarray | None = None
    writer: Any = None

    def add(self, ids: np.ndarray, labels: np.ndarray | None) -> None:
        self.pending_ids.append(ids)
        if labels is not None:
            self.pending_labels.append(labels)
        self.pending += len(ids)
        if self.pending >= max(self.window, FLUSH_IDS):
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        ids = np.concatenate(self.pending_ids)
        whole = len(ids) // self.window * self.window
        columns = {"input_ids": ids[:whole]}
        if self.masked:
            labels = np.concatenate(self.pending_labels)
            columns["labels"] = labels[:whole]
            targets = labels[:whole].reshape(-1, self.window)[:, 1:]
            self.loss_tokens += int((targets != IGNORE).sum())
            self.pending_labels = [labels[whole:]]
        else:
            self.loss_tokens += whole // self.window * (self.window - 1)
        counts = np.bincount(ids[:whole], minlength=self.vocab)
        self.counts = counts if self.counts is None else self.counts + counts
        self.pending_ids, self.pending = [ids[whole:]], len(ids) - whole
        self.sequences += whole // self.window
        table = pa.table(
            {
                name: pa.FixedSizeListArray.from_arrays(pa.array(values, pa.int32()), self.window)
                for name, values in columns.items()
            }
        )
        if self.writer is None:
            self.writer = pa.ipc.new_stream(str(self.path), table.schema)
        self.writer.write_table(table)

    def close(self) -> int:
        """Close the file; return the ids dropped (the last unfinished window)."""
        if self.pending >= self.window:
            self._flush()
        if self.writer is not None:
            self.writer.close()
        return self.pending


def pack(tokenized: Any, folder: Path, seq_len: int, vocab: int, progress: Any) -> dict[str, Any]:
    """Write `train.arrow` and `eval.arrow` in `folder`; return what was packed."""
    masked = "labels" in tokenized.column_names
    splits = {
        name: SplitWriter(folder / f"{name}.arrow", seq_len + 1, masked, vocab)
        for name in ("train", "eval")
    }
    documents = tokens = largest = 0
    for batch in tokenized.data.table.to_batches(max_chunksize=10_000):
        held = batch.column("held_out").to_numpy(zero_copy_only=False)
        ids_column = batch.column("ids")
        lengths = np.diff(ids_column.offsets.to_numpy())
        flat = ids_column.flatten().to_numpy()
        if len(flat):
            largest = max(largest, int(flat.max()))
        if largest >= vocab:
            raise DataError(
                f"the tokenizer gives id {largest}, beyond the model's vocabulary of {vocab}: "
                "use the model's own tokenizer"
            )
        labels = batch.column("labels").flatten().to_numpy() if masked else None
        for name, take in (("train", ~held), ("eval", held)):
            if not take.any():
                continue
            # The documents of one split, still in corpus order, as one flat run of ids.
            keep = np.repeat(take, lengths)
            splits[name].add(flat[keep], labels[keep] if labels is not None else None)
        documents += batch.num_rows
        tokens += len(flat)
        progress.update(batch.num_rows)
    dropped = sum(writer.close() for writer in splits.values())
    counts = sum(w.counts for w in splits.values() if w.counts is not None)
    return {
        "documents": documents,
        "tokens": tokens,
        "dropped_tokens": dropped,
        "sequences": {name: writer.sequences for name, writer in splits.items()},
        "loss_tokens": sum(writer.loss_tokens for writer in splits.values()),
        "unigram_entropy": entropy(counts) if isinstance(counts, np.ndarray) else 0.0,
        "masked": masked,
    }


def entropy(counts: np.ndarray) -> float:
    """Loss (nats/token) of the best model that ignores context."""
    probs = counts[counts > 0] / counts.sum()
    return float(-(probs * np.log(probs)).sum())
