"""The shard plan: the sorted inputs cut into shards, a function of the data and the settings.

A shard is a run of pieces: whole files, byte ranges of text and JSON lines files (a piece
owns the lines that start inside it), or row groups of Parquet files. Shards hold about
`shard_bytes` of input each; never does the cluster, the engine or the worker count change
the plan, so every engine writes the same shards.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from .manifest import DataError, filesystem
from .sources import InputFile, builder_of

MIB = 1 << 20
AUTO_SHARDS = 256  # the automatic shard size aims at this many shards ...
SMALLEST, LARGEST = 8 * MIB, 512 * MIB  # ... within these sizes


@dataclass(frozen=True)
class Piece:
    """Part of one input: bytes [start, end) of a text or JSON lines file, row groups
    [start, end) of a Parquet file, or rows [start, end) of a hub dataset."""

    url: str
    start: int
    end: int
    kind: str  # text, json, parquet or hub
    size: int  # the file as it was planned: read, it must still be so
    stamp: str

    def describe(self) -> str:
        unit = "row groups" if self.kind == "parquet" else "rows" if self.kind == "hub" else "bytes"
        return f"{self.url} {unit} {self.start}-{self.end}"


@dataclass(frozen=True)
class Shard:
    """One unit of work: its place in the plan and the pieces it reads, in order."""

    index: int
    pieces: tuple[Piece, ...]
    size: int  # input bytes (estimated for row groups and rows)

    @property
    def name(self) -> str:
        return f"shard-{self.index:05d}"

    def describe(self) -> str:
        more = f" (+{len(self.pieces) - 1} more)" if len(self.pieces) > 1 else ""
        return f"shard {self.index} ({self.pieces[0].describe()}{more})"


def shard_bytes(total: int, chosen: int = 0) -> int:
    """The chosen shard size, or about AUTO_SHARDS shards within SMALLEST..LARGEST bytes."""
    if chosen:
        return chosen
    return min(LARGEST, max(SMALLEST, -(-total // AUTO_SHARDS // MIB) * MIB))


def _units(item: InputFile, kind: str) -> list[tuple[int, int, int]]:
    """A file's indivisible units as (start, end, bytes): row groups of Parquet, else a
    JSON array whole, else single bytes (returned as one run: it can be cut anywhere)."""
    if kind == "parquet":
        import pyarrow.parquet as pq

        fs, path = filesystem(item.url)
        with fs.open(path, "rb") as handle:
            meta = pq.ParquetFile(handle).metadata
        return [(g, g + 1, meta.row_group(g).total_byte_size) for g in range(meta.num_row_groups)]
    return [(0, item.size, item.size)]


def is_json_array(item: InputFile) -> bool:
    """A `.json` file holding one array (read whole) rather than JSON lines (read in pieces)."""
    fs, path = filesystem(item.url)
    with fs.open(path, "rb") as handle:
        return handle.read(4096).lstrip()[:1] == b"["


def plan(files: list[InputFile], chosen: int = 0) -> tuple[list[Shard], int]:
    """The shards of the sorted inputs, and the shard size used."""
    kinds = [str(builder_of(f.url)) for f in files]
    size = shard_bytes(sum(f.size for f in files), chosen)
    with ThreadPoolExecutor(max_workers=16) as pool:  # Parquet footers: one read per file
        units = list(pool.map(_units, files, kinds))
    shards: list[Shard] = []
    pieces: list[Piece] = []
    filled = 0

    def close() -> None:
        nonlocal pieces, filled
        if pieces:
            shards.append(Shard(len(shards), tuple(pieces), filled))
        pieces, filled = [], 0

    for place, (item, kind) in enumerate(zip(files, kinds, strict=True)):
        if item.size == 0:
            continue
        whole = item.url.lower().endswith(".json") and is_json_array(item)
        for start, end, weight in units[place]:
            at = start
            while at < end:
                cut = end if whole or kind == "parquet" else min(end, at + size - filled)
                taken = weight if kind == "parquet" or whole else cut - at
                pieces.append(Piece(item.url, at, cut, kind, item.size, item.stamp))
                filled += taken
                at = cut
                if filled >= size:
                    close()
    close()
    return shards, size


def plan_rows(name: str, rows: int, nbytes: int, chosen: int = 0) -> tuple[list[Shard], int]:
    """The shards of a hub dataset already on this machine: runs of rows."""
    size = shard_bytes(nbytes, chosen)
    per_shard = max(1, rows * size // max(1, nbytes))
    shards = [
        Shard(i, (Piece(name, start, min(rows, start + per_shard), "hub", rows, ""),),
              (min(rows, start + per_shard) - start) * nbytes // max(1, rows))
        for i, start in enumerate(range(0, rows, per_shard))
    ]  # fmt: skip
    return shards, size


def to_json(shards: list[Shard]) -> list[dict[str, Any]]:
    return [asdict(shard) for shard in shards]


def from_json(data: list[dict[str, Any]]) -> list[Shard]:
    return [Shard(s["index"], tuple(Piece(**p) for p in s["pieces"]), s["size"]) for s in data]


def first_record(item: InputFile) -> dict[str, Any] | None:
    """The first record of a JSON lines or JSON array file, or None when it holds none."""
    fs, path = filesystem(item.url)
    with fs.open(path, "rb") as handle:
        if is_json_array(item):
            records = json.load(handle)
            return records[0] if records else None
        for line in handle:
            if line.strip():
                try:
                    return dict(json.loads(line))
                except (ValueError, TypeError):
                    raise DataError(f"{item.url}: its first record is not a JSON object") from None
    return None
