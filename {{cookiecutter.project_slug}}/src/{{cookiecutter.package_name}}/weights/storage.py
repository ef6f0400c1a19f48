"""The files of one folder read by byte range, in place: local, or behind any fsspec URL.

A local folder (or a Cloud Storage FUSE mount) is read with one `pread` per range. A remote one
(`gs://`, any fsspec URL) with byte-range requests, all of a read's ranges in one `cat_ranges`
call, which gcsfs runs concurrently; ranges closer than `gap` are fetched as one request (the
bytes between them are read and dropped: far cheaper than a request each), and a range longer
than `part` is fetched as several, so one large read is not one slow stream.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

REMOTE_GAP = 256 * 1024  # bytes between two ranges that are cheaper fetched than requested apart
REMOTE_PART = 32 * 1024 * 1024  # the longest range fetched by one request


class WeightsError(ValueError):
    """A pretrained source that cannot be used; one line says which file/key and why."""


class Folder:
    """A folder's files: listed once, read by byte range; picklable (files reopen lazily)."""

    def __init__(self, location: str, gap: int = REMOTE_GAP, part: int = REMOTE_PART) -> None:
        self.location = location
        self.remote = "://" in location and not location.startswith("file://")
        self.path = location if self.remote else location.removeprefix("file://")
        self.gap, self.part = gap, part
        self._fs: Any = None
        self._files: dict[str, int] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None, "_files": {}, "_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    @property
    def fs(self) -> Any:
        if self._fs is None:
            from fsspec.core import url_to_fs

            self._fs, self.path = url_to_fs(self.location)
        return self._fs

    def join(self, name: str) -> str:
        return f"{self.path.rstrip('/')}/{name}" if self.remote else os.path.join(self.path, name)

    def sizes(self) -> dict[str, int]:
        """Each file's size by its name (FileNotFoundError: no such folder)."""
        if not self.remote:
            # os.stat follows the Hugging Face cache's symlinks to their blobs.
            return {e.name: os.stat(e.path).st_size
                    for e in os.scandir(self.path) if e.is_file()}  # fmt: skip
        if not self.fs.isdir(self.path):
            raise FileNotFoundError(self.location)
        entries = self.fs.ls(self.path, detail=True)
        return {e["name"].rstrip("/").rsplit("/", 1)[-1]: int(e["size"])
                for e in entries if e["type"] == "file"}  # fmt: skip

    def read_file(self, name: str) -> bytes:
        if not self.remote:
            with open(self.join(name), "rb") as file:
                return file.read()
        return bytes(self.fs.cat_file(self.join(name)))

    def read_ranges(self, ranges: list[tuple[str, int, int]]) -> list[bytes]:
        """The bytes of each (file, start, end) range, fetched at once; short reads refused."""
        if not self.remote:
            found = [self._pread(name, start, end - start) for name, start, end in ranges]
        else:
            paths = [self.join(name) for name, _, _ in ranges]
            starts, ends = [r[1] for r in ranges], [r[2] for r in ranges]
            found = self.fs.cat_ranges(paths, starts, ends, on_error="return") if ranges else []
        for (name, start, end), data in zip(ranges, found, strict=True):
            self._check(name, start, end, data)
        return list(found)

    def _check(self, name: str, start: int, end: int, data: bytes | BaseException) -> None:
        if isinstance(data, BaseException):
            raise WeightsError(f"{self.join(name)}: reading bytes {start}-{end} failed: {data}")
        if len(data) != end - start:
            raise WeightsError(
                f"{self.join(name)}: bytes {start}-{end} hold {len(data)} bytes: the file "
                "changed or was cut short while it was read"
            )

    def read_rows(self, name: str, starts: np.ndarray, length: int, into: np.ndarray) -> int:
        """Fill `into` with the `length` bytes at each of `starts`, in order; the bytes fetched."""
        if not self.remote:
            for row, start in enumerate(starts.tolist()):
                data = self._pread(name, start, length)
                self._check(name, start, start + length, data)
                into[row * length : (row + 1) * length] = np.frombuffer(data, np.uint8)
            return len(starts) * length
        # Runs of rows closer than `gap`, each fetched whole in parts of at most `part` bytes.
        breaks = np.flatnonzero(starts[1:] - (starts[:-1] + length) > self.gap) + 1
        runs = np.split(starts, breaks)
        begins = np.array([run[0] for run in runs], dtype=np.int64)
        ends = np.array([run[-1] + length for run in runs], dtype=np.int64)
        fetched = int((ends - begins).sum())
        gapless = fetched == len(starts) * length
        staging = into if gapless else np.empty(fetched, np.uint8)
        at = np.concatenate([[0], np.cumsum(ends - begins)[:-1]]).astype(np.int64)
        runs_at = zip(begins.tolist(), ends.tolist(), at.tolist(), strict=True)
        parts = [(name, p, min(p + self.part, end), base + p - begin)
                 for begin, end, base in runs_at for p in range(begin, end, self.part)]  # fmt: skip
        found = self.read_ranges([part[:3] for part in parts])
        for (_, start, end, offset), data in zip(parts, found, strict=True):
            staging[offset : offset + end - start] = np.frombuffer(data, np.uint8)
        if not gapless:
            row = 0
            for run, begin, base in zip(runs, begins.tolist(), at.tolist(), strict=True):
                for start in run.tolist():
                    offset = base + start - begin
                    into[row * length : (row + 1) * length] = staging[offset : offset + length]
                    row += 1
        return fetched

    def _pread(self, name: str, offset: int, size: int) -> bytes:
        with self._lock:
            if name not in self._files:
                self._files[name] = os.open(self.join(name), os.O_RDONLY)
            fd = self._files[name]
        return os.pread(fd, size, offset)

    def close(self) -> None:
        with self._lock:
            for fd in self._files.values():
                os.close(fd)
            self._files.clear()
