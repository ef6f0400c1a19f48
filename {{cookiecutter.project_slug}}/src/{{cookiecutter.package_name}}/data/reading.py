"""Reading a prepared dataset by index, one window at a time: host memory does not grow with it.

A local dataset is read in place. One on `gs://` (any fsspec URL) is copied once into a
local cache keyed by its fingerprint (`DATA_CACHE`, default `~/.cache/<package>/prepared`),
then read the same way: every host needs the disk for it, and no more memory.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from .encoding import same_identity
from .manifest import MANIFEST, DataError, Manifest, filesystem, join, read_manifest

CACHE_VARIABLE = "DATA_CACHE"
PACKAGE = __name__.split(".")[0]


@dataclass(frozen=True)
class Chunk:
    """Where one record batch's windows lie in its file."""

    path: str
    rows: int
    width: int
    ids_at: int  # byte offset of the first window's ids
    labels_at: int | None  # of its labels, when the dataset is masked


class PackedWindows(Dataset[dict[str, torch.Tensor]]):
    """Windows of `seq_len + 1` ids: `x` the first seq_len, `y` the next-token targets
    (-100 where a mask says the token carries no loss).

    Each window is read from its file with one `pread` at its offset: the process holds
    the window it reads and nothing around it, so its memory is the same for a corpus of
    any size (a memory map would count every page cached around each window as the
    process's own). Files open lazily, so DataLoader workers open their own.
    """

    def __init__(self, folder: str, length: int) -> None:
        self.folder = folder
        self.length = length
        self._chunks: list[Chunk] | None = None
        self._starts: np.ndarray | None = None
        self._files: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_files": {}}

    def _open(self) -> None:
        files = sorted(Path(self.folder).glob("*.arrow"))
        chunks = [chunk for path in files for chunk in _layout(path)]
        rows = sum(chunk.rows for chunk in chunks)
        if rows != self.length:
            raise DataError(f"{self.folder!r} holds {rows} sequences, its manifest {self.length}")
        self._chunks = chunks
        self._starts = np.cumsum([0] + [chunk.rows for chunk in chunks])

    def __len__(self) -> int:
        return self.length

    def _read(self, path: str, offset: int, width: int) -> torch.Tensor:
        if path not in self._files:
            self._files[path] = os.open(path, os.O_RDONLY)
        data = os.pread(self._files[path], width * 4, offset)
        return torch.from_numpy(np.frombuffer(data, dtype=np.int32).astype(np.int64))

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self._chunks is None:
            self._open()
        assert self._chunks is not None and self._starts is not None
        if not 0 <= index < self.length:
            raise IndexError(index)
        at = int(np.searchsorted(self._starts, index, side="right")) - 1
        chunk = self._chunks[at]
        step = (index - int(self._starts[at])) * chunk.width * 4
        window = self._read(chunk.path, chunk.ids_at + step, chunk.width)
        if chunk.labels_at is None:
            return {"x": window[:-1], "y": window[1:]}
        labels = self._read(chunk.path, chunk.labels_at + step, chunk.width)
        return {"x": window[:-1], "y": labels[1:]}


def _layout(path: Path) -> list[Chunk]:
    """The offsets of an Arrow stream file's windows, from its batch headers alone."""
    import pyarrow as pa

    with open(path, "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    base = pa.py_buffer(mapped)
    chunks = []
    for batch in pa.ipc.open_stream(base).read_all().to_batches():
        starts = [_values_at(batch.column(name), base.address) if name in batch.schema.names
                  else None for name in ("input_ids", "labels")]  # fmt: skip
        width = batch.column("input_ids").type.list_size
        assert starts[0] is not None
        chunks.append(Chunk(str(path), batch.num_rows, width, starts[0], starts[1]))
    return chunks


def _values_at(column: Any, base: int) -> int:
    """The file offset of a fixed-size-list column's first int32 id (no nulls, no copy)."""
    values = column.flatten()
    if values.type != "int32" or column.null_count or values.null_count:
        raise DataError("a prepared window column must hold int32 ids without nulls")
    return int(values.buffers()[1].address + values.offset * 4 - base)


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
