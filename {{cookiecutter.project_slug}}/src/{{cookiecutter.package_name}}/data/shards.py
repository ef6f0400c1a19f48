"""One shard, start to end: read its pieces, tokenize, pack, and write its files to the output.

What every engine runs (a process here, a Ray task on a cluster). The shard's window files
are published whole or not at all (`ShardFiles`). Its record, `shards/shard-NNNNN.done`
(counts, file layout, the input it read), comes last: a shard is finished when its record
exists, and a rerun skips it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .encoding import TEXT, Encoder, Tokenizer
from .manifest import SPLITS, filesystem, join
from .packing import Packer
from .plan import Shard
from .records import batches

RECORDS = "shards"
DONE = ".done"
TEMPORARY = ".tmp-"  # the prefix of work in progress in a local output; a rerun removes it
UPLOAD_BUFFER = 16 << 20  # bytes a remote window file holds in memory before it sends them


class ShardFailed(RuntimeError):
    """A shard that could not be written (not the data's fault): a rerun resumes."""


@dataclass(frozen=True)
class Job:
    """What every shard of one `prepare` shares (sent once to each worker)."""

    out: str
    tokenizer: Tokenizer
    mode: str
    field: str
    seq_len: int
    vocab: int
    eval_fraction: float
    hub: Any = None  # a hub dataset already on this machine (the local engine only)
    upload_buffer: int = UPLOAD_BUFFER


def is_local(location: str) -> bool:
    return "://" not in location or location.startswith("file://")


def record_path(out: str, index: int) -> str:
    return join(out, RECORDS, f"shard-{index:05d}{DONE}")


def window_path(out: str, split: str, index: int) -> str:
    return join(out, split, f"shard-{index:05d}.arrow")


def first_line(error: BaseException) -> str:
    """An error as one line: its type and the start of its message."""
    text = str(error).strip() or type(error).__name__
    return f"{type(error).__name__}: {text.splitlines()[0][:300]}"


def run_shard(job: Job, shard: Shard) -> dict[str, Any]:
    """Prepare one shard into the output; return its record."""
    files = ShardFiles(job.out.removeprefix("file://"), shard.index, job.upload_buffer)
    try:
        encoder = Encoder(job.tokenizer, job.mode, job.field, job.eval_fraction)
        packer = Packer(files.sinks, job.seq_len, job.vocab)
        for columns in batches(shard, job.mode, job.field, job.hub):
            encoded = encoder(columns)
            packer.add(encoded["ids"], encoded.get("labels"), encoded["held_out"])
        record = packer.close(masked=job.mode != TEXT)
        record["layout"] = {split: packer.splits[split].layout for split in SPLITS}
        record["shard"] = shard.index
        record["input"] = [piece.describe() for piece in shard.pieces]
        files.publish(record)
        return record
    finally:
        files.discard()  # what is not published by now never will be


class ShardFiles:
    """A shard's window files while they are written, and their publication.

    In a local (or mounted) output the files are built in a folder beside their place and
    renamed into it. Anywhere else (`gs://`) each file is an upload to its final name, sent
    as it is written (at most `buffer` bytes held in memory, nothing on local disk), that
    appears only when it is finalized, on close; one not finalized is discarded.
    """

    def __init__(self, out: str, index: int, buffer: int) -> None:
        self.out, self.index, self.local = out, index, is_local(out)
        self.sinks: dict[str, Any] = {}
        self.scratch = Path(out) / f"{TEMPORARY}shard-{index:05d}-{uuid.uuid4().hex[:8]}"
        if self.local:  # beside the final place: publishing is a rename
            self.scratch.mkdir(parents=True)
            for split in SPLITS:
                self.sinks[split] = open(self.scratch / f"{split}.arrow", "wb")  # noqa: SIM115
        else:
            fs, _ = filesystem(out)
            for split in SPLITS:
                path = filesystem(window_path(out, split, index))[1]
                self.sinks[split] = fs.open(path, "wb", block_size=buffer)

    def publish(self, record: dict[str, Any]) -> None:
        """The window files in their places, then the shard's record."""
        text = json.dumps(record)
        if not self.local:
            for sink in self.sinks.values():
                sink.close()  # finalizes the upload: the object appears whole
            self.sinks = {}
            fs, path = filesystem(record_path(self.out, self.index))
            fs.pipe(path, text.encode())
            return
        for split, sink in self.sinks.items():
            sink.close()
            _move(self.scratch / f"{split}.arrow", window_path(self.out, split, self.index))
        self.sinks = {}
        (self.scratch / "record.json").write_text(text)
        _move(self.scratch / "record.json", record_path(self.out, self.index))

    def discard(self) -> None:
        """Drop whatever was not published: local files, and uploads never finalized."""
        for sink in self.sinks.values():
            if self.local:
                sink.close()
            else:
                _abandon(sink)
        self.sinks = {}
        if self.local:
            shutil.rmtree(self.scratch, ignore_errors=True)


def _move(source: Path, target: str) -> None:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.replace(source, target)


def _abandon(upload: Any) -> None:
    """Cancel an upload without finalizing it. fsspec finalizes a write file when it is
    closed or garbage collected, so it is marked closed once its upload is cancelled."""
    with contextlib.suppress(Exception):  # an upload not finalized never appears anyway
        upload.discard()  # gcsfs: cancels the resumable upload, if one was begun
    upload.closed = True


def finished(out: str) -> dict[int, str]:
    """The shards whose record is in the output: their index and the record's path."""
    fs, path = filesystem(out)
    try:
        names = fs.ls(join(path, RECORDS), detail=False)
    except (FileNotFoundError, OSError):
        return {}
    found = {}
    for name in names:
        base = os.path.basename(name.rstrip("/"))
        if base.startswith("shard-") and base.endswith(DONE):
            found[int(base[len("shard-") : -len(DONE)])] = name
    return found


def read_records(out: str, paths: list[str]) -> list[dict[str, Any]]:
    """The records at `paths` (read at once: one request each, in parallel on gs://)."""
    if not paths:
        return []
    fs, _ = filesystem(out)
    texts = fs.cat(paths)
    return [json.loads(texts[p]) for p in paths]


def remove_temporary(out: str) -> None:
    """Work in progress that a stopped run left in a local output."""
    if not is_local(out) or not os.path.isdir(out.removeprefix("file://")):
        return
    folder = Path(out.removeprefix("file://"))
    for stale in folder.glob(f"{TEMPORARY}*"):
        shutil.rmtree(stale, ignore_errors=True)
