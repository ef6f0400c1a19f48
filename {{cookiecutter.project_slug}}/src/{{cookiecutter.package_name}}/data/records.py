"""Records of one shard, read streaming from its pieces (local or any fsspec URL), in batches.

No input is copied whole: text and JSON lines are read in blocks from their byte range,
Parquet by row group. Records are checked as they come: undecodable bytes and fields that
are not text are named by `file:line (byte N)`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from .encoding import CHAT, PROMPT_COMPLETION, TEXT, mode_of
from .manifest import DataError, filesystem
from .plan import Piece, Shard, first_record, is_json_array
from .sources import TEXT_TYPES, InputFile

BLOCK = 1 << 20  # bytes read at a time
BATCH = 1000  # records tokenized at a time
Batch = dict[str, list[Any]]


def fields_of(mode: str, field: str) -> list[str]:
    """The fields a record of `mode` is read for."""
    return {TEXT: [field], PROMPT_COMPLETION: ["prompt", "completion"], CHAT: ["messages"]}[mode]


def detect_mode(files: list[InputFile], kind: str, field: str) -> str:
    """What the records are (text, prompt-completion, chat), from the first file's fields;
    refuse a text field that is not there or not text."""
    where = ", ".join(f.url for f in files[:3]) + (" ..." if len(files) > 3 else "")
    if kind == "text":
        columns: dict[str, str] = {"text": "string"}
    elif kind == "parquet":
        import pyarrow.parquet as pq

        fs, path = filesystem(files[0].url)
        with fs.open(path, "rb") as handle:
            schema = pq.ParquetFile(handle).schema_arrow
        columns = {name: str(schema.field(name).type) for name in schema.names}
    else:
        record = next((r for f in files if f.size and (r := first_record(f))), None)
        if record is None:
            raise DataError(f"{where} holds no documents: the corpus is empty")
        columns = {name: _json_type(value) for name, value in record.items()}
    mode = mode_of(list(columns), field)
    if mode == TEXT:
        if field not in columns:
            have = ", ".join(sorted(columns)) or "none"
            raise DataError(
                f"{where} has no field {field!r} (its fields: {have}): name the text field "
                "with --field"
            )
        if columns[field] not in (*TEXT_TYPES, "null"):
            raise DataError(f"field {field!r} of {where} holds {columns[field]}, not text")
    return mode


def check_parquet_fields(files: list[InputFile], mode: str, field: str) -> None:
    """Every Parquet file has the fields the records are read for, as text where text."""
    import pyarrow.parquet as pq

    for item in files:
        fs, path = filesystem(item.url)
        with fs.open(path, "rb") as handle:
            schema = pq.ParquetFile(handle).schema_arrow
        for name in fields_of(mode, field):
            if name not in schema.names:
                raise DataError(f"{item.url} has no field {name!r}: every file needs it")
            kind = str(schema.field(name).type)
            if mode == TEXT and kind not in TEXT_TYPES:
                raise DataError(f"field {name!r} of {item.url} holds {kind}, not text")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return "string" if isinstance(value, str) else type(value).__name__


def batches(shard: Shard, mode: str, field: str, hub: Any = None) -> Iterator[Batch]:
    """The shard's records in corpus order, `BATCH` at a time: the fields they are read for."""
    names = fields_of(mode, field)
    columns: dict[str, list[Any]] = {name: [] for name in names}
    count = 0
    for piece in shard.pieces:
        for record in _records(piece, mode, field, hub):
            for name in names:
                columns[name].append(record.get(name))
            count += 1
            if count == BATCH:
                yield columns
                columns, count = {name: [] for name in names}, 0
    if count:
        yield columns


def _records(piece: Piece, mode: str, field: str, hub: Any) -> Iterator[Any]:
    if piece.kind == "hub":
        yield from hub.select(range(piece.start, piece.end))
        return
    fs, path = filesystem(piece.url)
    try:
        info = fs.info(path)
    except FileNotFoundError:
        raise DataError(
            f"{piece.url} was removed after prepare listed it: run prepare again"
        ) from None
    if int(info.get("size") or 0) != piece.size:
        raise DataError(
            f"{piece.url} changed after prepare listed it ({piece.size} bytes, now "
            f"{info.get('size')}): run prepare again"
        )
    if piece.kind == "parquet":
        yield from _parquet(piece, fs, path, fields_of(mode, field))
    elif (
        piece.kind == "json"
        and piece.url.lower().endswith(".json")
        and is_json_array(InputFile(piece.url, piece.size, piece.stamp))
    ):
        with fs.open(path, "rb") as handle:
            for row, record in enumerate(json.load(handle)):
                yield _checked(record, piece, row, mode, field)
    else:
        for offset, line in _lines(piece, fs, path):
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as error:
                bad = offset + error.start
                raise DataError(
                    f"undecodable bytes at {_line_of(piece, fs, path, bad)} (byte {bad}): "
                    "the corpus must be UTF-8 text"
                ) from None
            if piece.kind == "text":
                yield {"text": text.removesuffix("\r")}
                continue
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except ValueError as error:
                where = _line_of(piece, fs, path, offset)
                raise DataError(f"cannot read {where}: {error}") from None
            yield _checked(record, piece, offset, mode, field, fs, path)


def _checked(record: Any, piece: Piece, at: int, mode: str, field: str, fs: Any = None,
             path: str = "") -> Any:  # fmt: skip
    """A JSON record whose text field is text (or absent: an empty document)."""
    if not isinstance(record, dict):
        where = _line_of(piece, fs, path, at) if fs else f"{piece.url} record {at}"
        raise DataError(f"{where} is not a JSON object")
    value = record.get(field)
    if mode == TEXT and value is not None and not isinstance(value, str):
        where = _line_of(piece, fs, path, at) if fs else f"{piece.url} record {at}"
        raise DataError(f"field {field!r} of {where} holds {_json_type(value)}, not text")
    return record


def _lines(piece: Piece, fs: Any, path: str) -> Iterator[tuple[int, bytes]]:
    """The lines that start in [start, end), with their offsets: the one crossing `end` read
    whole, the one crossing `start` left to the piece before."""
    with fs.open(path, "rb", block_size=BLOCK) as handle:
        at = max(0, piece.start - 1)
        handle.seek(at)
        carry = b""
        if piece.start > 0:  # skip through the first newline at or after start - 1
            while True:
                block = handle.read(BLOCK)
                if not block:
                    return
                newline = block.find(b"\n")
                if newline >= 0:
                    at += newline + 1
                    carry = block[newline + 1 :]
                    break
                at += len(block)
        while at < piece.end:
            block = handle.read(BLOCK)
            lines = (carry + block).split(b"\n")
            carry = lines.pop()
            for line in lines:
                if at >= piece.end:
                    return
                yield at, line
                at += len(line) + 1
            if not block:  # the end of the file: its last line may have no newline
                if carry and at < piece.end:
                    yield at, carry
                return


def _line_of(piece: Piece, fs: Any, path: str, byte: int) -> str:
    """`file:line` of a byte (the file is read again up to it: only on the way to an error)."""
    count, seen = 1, 0
    with fs.open(path, "rb", block_size=BLOCK) as handle:
        while seen < byte:
            block = handle.read(min(BLOCK, byte - seen))
            if not block:
                break
            count += block.count(b"\n")
            seen += len(block)
    return f"{piece.url}:{count}"


def _parquet(piece: Piece, fs: Any, path: str, names: list[str]) -> Iterator[Any]:
    import pyarrow.parquet as pq

    with fs.open(path, "rb") as handle:
        groups = list(range(piece.start, piece.end))
        for batch in pq.ParquetFile(handle).iter_batches(BATCH, groups, columns=names):
            yield from batch.to_pylist()
