"""Reading a prepared dataset by index, in place: host memory and disk do not grow with it.

Each window is read at its offset in its shard file, from the split's `index.json`. A local
dataset (or one on a Cloud Storage FUSE mount) is read with one `pread` per window; one on
`gs://` (any fsspec URL) with byte-range requests, a batch's windows fetched at once, and
the windows a sampler will ask for fetched ahead of it (`readahead`): nothing is copied.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from .encoding import same_identity
from .manifest import INDEX, MANIFEST, DataError, Manifest, filesystem, join, read_manifest
from .packing import IDS, LABELS, file_layout
from .readahead import ReadAhead

Sample = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Chunk:
    """Where one record batch's windows lie in its file."""

    path: str
    rows: int
    width: int
    at: dict[str, int]  # byte offset of each column's first value


class PackedWindows(Dataset[Sample]):
    """Windows of `seq_len + 1` ids: `x` the first seq_len, `y` the next-token targets
    (-100 where a mask says the token carries no loss).

    Each window is read from its file at its offset: the process holds the windows it
    reads and nothing around them, so its memory is the same for a corpus of any size (a
    memory map would count every page cached around each window as the process's own).
    Files open lazily, so DataLoader workers open their own.
    """

    def __init__(self, folder: str, length: int) -> None:
        self.folder = folder
        self.length = length
        self.remote = "://" in folder and not folder.startswith("file://")
        self._chunks: list[Chunk] | None = None
        self._starts: np.ndarray | None = None
        self._files: dict[str, int] = {}
        self._fs: Any = None
        self.ahead: ReadAhead | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_files": {}, "_fs": None, "ahead": None}

    @property
    def reads_ahead(self) -> bool:
        """Whether a sampler should announce the windows it will ask for (remote data)."""
        return self.remote

    def _open(self) -> None:
        fs, path = filesystem(self.folder)
        self._fs = fs
        try:
            index = json.loads(fs.cat_file(join(path, INDEX)))
            chunks = [
                Chunk(join(path, item["name"]), c["rows"], c["width"], c["at"])
                for item in index["files"]
                for c in item["chunks"]
            ]
        except FileNotFoundError:
            if self.remote:
                raise DataError(f"{self.folder!r} has no {INDEX}: prepare it again") from None
            files = sorted(Path(path).glob("*.arrow"))
            chunks = [Chunk(str(f), c["rows"], c["width"], c["at"])
                      for f in files for c in file_layout(f)]  # fmt: skip
        rows = sum(chunk.rows for chunk in chunks)
        if rows != self.length:
            raise DataError(f"{self.folder!r} holds {rows} sequences, its manifest {self.length}")
        self._chunks = chunks
        self._starts = np.cumsum([0] + [chunk.rows for chunk in chunks])

    def __len__(self) -> int:
        return self.length

    def ranges(self, indices: list[int]) -> list[tuple[str, int, int]]:
        """The byte ranges of the windows at `indices`: ids, then labels when masked."""
        if self._chunks is None:
            self._open()
        assert self._chunks is not None and self._starts is not None
        found = []
        for index in indices:
            if not 0 <= index < self.length:
                raise IndexError(index)
            at = int(np.searchsorted(self._starts, index, side="right")) - 1
            chunk = self._chunks[at]
            step = (index - int(self._starts[at])) * chunk.width * 4
            for name in (IDS, LABELS):
                if name in chunk.at:
                    start = chunk.at[name] + step
                    found.append((chunk.path, start, start + chunk.width * 4))
        return found

    def fetch(self, indices: list[int]) -> list[bytes]:
        """The bytes of the windows at `indices` (ids, then labels when masked, each)."""
        ranges = self.ranges(indices)
        if self.remote:
            paths, starts, ends = zip(*ranges, strict=True) if ranges else ((), (), ())
            return list(self._fs.cat_ranges(list(paths), list(starts), list(ends)))
        return [self._pread(path, start, end - start) for path, start, end in ranges]

    def _pread(self, path: str, offset: int, size: int) -> bytes:
        if path not in self._files:
            self._files[path] = os.open(path, os.O_RDONLY)
        return os.pread(self._files[path], size, offset)

    def __getitems__(self, indices: list[int]) -> list[Sample]:
        """A batch's windows: fetched ahead when a sampler announced them, else now, at once."""
        if self.ahead is not None:
            data = self.ahead.take(indices, self.fetch)
        else:
            data = self.fetch(list(indices))
        per = len(data) // max(1, len(indices))
        return [_sample(data[i * per : (i + 1) * per]) for i in range(len(indices))]

    def __getitem__(self, index: int) -> Sample:
        return self.__getitems__([index])[0]


def _sample(parts: list[bytes]) -> Sample:
    window = torch.from_numpy(np.frombuffer(parts[0], dtype=np.int32).astype(np.int64))
    targets = window if len(parts) == 1 else torch.from_numpy(
        np.frombuffer(parts[1], dtype=np.int32).astype(np.int64)
    )  # fmt: skip
    return {"x": window[:-1], "y": targets[1:]}


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
    folder = location.removeprefix("file://")
    train = PackedWindows(join(folder, "train"), manifest.sequences["train"])
    held_out = PackedWindows(join(folder, "eval"), manifest.sequences["eval"])
    return train, held_out, manifest
