"""One shard, start to end: read its pieces, tokenize, pack, and write its files to the output.

What every engine runs (a process here, a Ray task on a cluster). The shard's window files
are written under temporary names and published whole: renamed in a local or mounted
folder, uploaded to the final name on `gs://` (an object appears only when whole). Its
record, `shards/shard-NNNNN.done` (counts, file layout, the input it read), comes last: a
shard is finished when its record exists, and a rerun skips it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .encoding import TEXT, Encoder, Tokenizer
from .manifest import SPLITS, filesystem, join
from .packing import Packer, file_layout
from .plan import Shard
from .records import batches

RECORDS = "shards"
DONE = ".done"
TEMPORARY = ".tmp-"  # the prefix of work in progress in a local output; a rerun removes it


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


def is_local(location: str) -> bool:
    return "://" not in location or location.startswith("file://")


def record_path(out: str, index: int) -> str:
    return join(out, RECORDS, f"shard-{index:05d}{DONE}")


def window_path(out: str, split: str, index: int) -> str:
    return join(out, split, f"shard-{index:05d}.arrow")


def run_shard(job: Job, shard: Shard) -> dict[str, Any]:
    """Prepare one shard into the output; return its record."""
    local = is_local(job.out)
    out = job.out.removeprefix("file://")
    if local:  # built beside its final place, so that publishing it is a rename
        scratch = Path(out) / f"{TEMPORARY}{shard.name}-{uuid.uuid4().hex[:8]}"
        scratch.mkdir(parents=True)
    else:
        scratch = Path(tempfile.mkdtemp(prefix=f"prepare-{shard.name}-"))
    try:
        encoder = Encoder(job.tokenizer, job.mode, job.field, job.eval_fraction)
        packer = Packer(scratch, job.seq_len, job.vocab)
        for columns in batches(shard, job.mode, job.field, job.hub):
            encoded = encoder(columns)
            packer.add(encoded["ids"], encoded.get("labels"), encoded["held_out"])
        record = packer.close(masked=job.mode != TEXT)
        record["layout"] = {split: file_layout(scratch / f"{split}.arrow") for split in SPLITS}
        record["shard"] = shard.index
        record["input"] = [piece.describe() for piece in shard.pieces]
        for split in SPLITS:
            _publish(scratch / f"{split}.arrow", window_path(out, split, shard.index), local)
        done = scratch / "record.json"
        done.write_text(json.dumps(record))
        _publish(done, record_path(out, shard.index), local)
        return record
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _publish(source: Path, target: str, local: bool) -> None:
    if local:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(source, target)
    else:
        fs, path = filesystem(target)
        fs.put_file(str(source), path)


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
