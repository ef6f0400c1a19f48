"""Reading a prepared dataset by index, memory-mapped: host memory does not grow with it.

A local dataset is read in place. One on `gs://` (any fsspec URL) is copied once into a
local cache keyed by its fingerprint (`DATA_CACHE`, default `~/.cache/<package>/prepared`),
then read the same way: every host needs the disk for it, and no more memory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from .encoding import same_identity
from .manifest import MANIFEST, DataError, Manifest, filesystem, join, read_manifest

CACHE_VARIABLE = "DATA_CACHE"
PACKAGE = __name__.split(".")[0]


class PackedWindows(Dataset[dict[str, torch.Tensor]]):
    """Windows of `seq_len + 1` ids: `x` the first seq_len, `y` the next-token targets
    (-100 where a mask says the token carries no loss). Opened lazily in each process, so
    DataLoader workers map the files themselves instead of receiving copies."""

    def __init__(self, folder: str, length: int) -> None:
        self.folder = folder
        self.length = length
        self._chunks: list[tuple[np.ndarray, np.ndarray | None]] | None = None
        self._starts: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"folder": self.folder, "length": self.length, "_chunks": None, "_starts": None}

    def _open(self) -> None:
        import pyarrow as pa

        chunks: list[tuple[np.ndarray, np.ndarray | None]] = []
        for path in sorted(Path(self.folder).glob("*.arrow")):
            table = pa.ipc.open_stream(pa.memory_map(str(path))).read_all()
            for batch in table.to_batches():
                ids = _rows(batch.column("input_ids"))
                labels = _rows(batch.column("labels")) if "labels" in batch.schema.names else None
                chunks.append((ids, labels))
        rows = sum(len(ids) for ids, _ in chunks)
        if rows != self.length:
            raise DataError(f"{self.folder!r} holds {rows} sequences, its manifest {self.length}")
        self._chunks = chunks
        self._starts = np.cumsum([0] + [len(ids) for ids, _ in chunks])

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self._chunks is None:
            self._open()
        assert self._chunks is not None and self._starts is not None
        if not 0 <= index < self.length:
            raise IndexError(index)
        chunk = int(np.searchsorted(self._starts, index, side="right")) - 1
        ids, labels = self._chunks[chunk]
        row = index - int(self._starts[chunk])
        window = torch.from_numpy(ids[row].astype(np.int64))
        if labels is None:
            return {"x": window[:-1], "y": window[1:]}
        targets = torch.from_numpy(labels[row, 1:].astype(np.int64))
        return {"x": window[:-1], "y": targets}


def _rows(column: Any) -> np.ndarray:
    """A fixed-size-list column as a (rows, width) view of the mapped file: no copy."""
    width = column.type.list_size
    return column.flatten().to_numpy(zero_copy_only=True).reshape(-1, width)


def cache_root() -> Path:
    default = Path.home() / ".cache" / PACKAGE / "prepared"
    return Path(os.environ.get(CACHE_VARIABLE) or default)


def local_copy(location: str, manifest: Manifest) -> str:
    """A local folder holding the prepared dataset: itself, or its cached copy."""
    if "://" not in location or location.startswith("file://"):
        return location.removeprefix("file://")
    target = cache_root() / manifest.fingerprint
    if read_manifest(str(target)) is not None:
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fs, path = filesystem(location)
    partial = tempfile.mkdtemp(prefix=".partial-", dir=target.parent)
    try:
        for split in ("train", "eval"):
            fs.get(join(path, split), os.path.join(partial, split), recursive=True)
        fs.get(join(path, MANIFEST), os.path.join(partial, MANIFEST))  # last: the copy is whole
        os.replace(partial, target)
    except OSError:
        if read_manifest(str(target)) is None:  # not another process's copy, finished first
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return str(target)


def open_prepared(
    location: str, seq_len: int, tokenizer: str, vocab_size: int
) -> tuple[PackedWindows, PackedWindows, Manifest]:
    """The train and eval windows of a prepared dataset made for this run, or a DataError."""
    manifest = read_manifest(location)
    if manifest is None:
        raise DataError(
            f"{location!r} is not a prepared dataset (no {MANIFEST}: an interrupted prepare "
            "leaves none): run prepare"
        )
    if manifest.seq_len != seq_len:
        raise DataError(
            f"{location!r} was prepared for seq_len {manifest.seq_len}, this run has {seq_len}: "
            f"set task_options.seq_len={manifest.seq_len}, or prepare it again"
        )
    if not same_identity(manifest.tokenizer, tokenizer):
        raise DataError(
            f"{location!r} was prepared with tokenizer {manifest.tokenizer}, this run's is "
            f"{tokenizer}: prepare it again with this task's settings"
        )
    if manifest.vocab_size > vocab_size:
        raise DataError(
            f"{location!r} holds ids up to {manifest.vocab_size - 1}, beyond this model's "
            f"vocabulary of {vocab_size}"
        )
    folder = local_copy(location, manifest)
    train = PackedWindows(os.path.join(folder, "train"), manifest.sequences["train"])
    held_out = PackedWindows(os.path.join(folder, "eval"), manifest.sequences["eval"])
    return train, held_out, manifest
