"""What every backend's checkpoints share: the layout of a checkpoint directory, its errors,
and reading it with torch alone.

A checkpoint directory (`checkpoint_dir`: a local path or any fsspec URL, `gs://...`
through gcsfs) holds one folder per saved step: `.metadata`, the `.distcp` shards each
process wrote, and `.manager_metadata`, written last, once the rest is whole. A folder
without it was cut off mid-save and is ignored, so a crash never costs the previous
checkpoint. The backend's `checkpointing` module writes and restores them.
"""

from __future__ import annotations

import posixpath
import warnings
from typing import Any

# Notes torch and torch_xla print on every save or load about their own internals.
_NOTES = (
    "TypedStorage is deprecated",
    "The function definition for SavePlanner",
    "torch.distributed is disabled, unavailable or uninitialized",  # one process reads
    "Using a non-tuple sequence for multidimensional indexing",  # torch_xla's shard copy
)
for _note in _NOTES:
    warnings.filterwarnings("ignore", message=_note, category=UserWarning)

COMMIT_MARKER = ".manager_metadata"  # the last file of a save: the checkpoint is whole
DCP_METADATA = ".metadata"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or written; the message says where and why."""


class CheckpointWriteError(CheckpointError):
    """A save that failed (unwritable or full destination); earlier checkpoints are whole."""


def failures() -> tuple[type[BaseException], ...]:
    """What a checkpoint read or write can raise: any error, and DCP's CheckpointException
    (a BaseException, so `except Exception` misses it)."""
    from torch.distributed.checkpoint.api import CheckpointException

    return (Exception, CheckpointException)


def reason(error: BaseException) -> str:
    """The first line of an error; for DCP's CheckpointException, of the error inside it."""
    failures_by_rank = getattr(error, "failures", None)
    if isinstance(failures_by_rank, dict) and failures_by_rank:
        inner = next(iter(failures_by_rank.values()))  # (exception, stack) of one rank
        error = inner[0] if isinstance(inner, tuple) else inner
    text = (str(error).strip() or type(error).__name__).splitlines()[0]
    return text[:300]


def filesystem(url: str) -> tuple[Any, str]:
    import fsspec

    try:
        fs, path = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as error:
        raise CheckpointError(f"cannot open {url!r}: {reason(error)}") from None
    return fs, path


def join(base: str, *parts: str) -> str:
    return posixpath.join(base.rstrip("/"), *parts)


def completed_steps(directory: str) -> list[int]:
    """Steps with a whole checkpoint in `directory`, oldest first (torch alone reads them)."""
    fs, path = filesystem(directory)
    try:
        entries = fs.ls(path, detail=False) if fs.isdir(path) else []
    except OSError:
        return []
    steps = []
    for entry in entries:
        name = posixpath.basename(entry.rstrip("/"))
        if name.isdigit() and fs.exists(join(entry, COMMIT_MARKER)):
            steps.append(int(name))
    return sorted(steps)


def find_checkpoint(location: str) -> str:
    """A checkpoint folder itself, or the newest whole checkpoint in a checkpoint directory."""
    fs, path = filesystem(location)
    if fs.exists(join(path, DCP_METADATA)):
        return location
    steps = completed_steps(location)
    if steps:
        return join(location, str(steps[-1]))
    if not fs.exists(path):
        raise CheckpointError(f"checkpoint {location!r} does not exist")
    raise CheckpointError(
        f"{location!r} is neither a checkpoint nor a directory holding one "
        "(no .metadata, no whole step folder)"
    )


def reader(location: str) -> Any:
    """torch.distributed.checkpoint's reader of a local or fsspec location."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    return FsspecReader(location) if "://" in location else FileSystemReader(location)


def flat_keys(location: str) -> set[str]:
    """The keys torch's planner flattened the saved state into (`config.lr`, ...)."""
    try:
        return set(reader(location).read_metadata().state_dict_metadata)
    except failures() as error:  # a missing or foreign file: several exception types
        raise CheckpointError(f"cannot read checkpoint {location!r}: {reason(error)}") from None


def saved_keys(location: str) -> set[str]:
    """The flattened names of everything a checkpoint holds (`model.embed.weight`, ...) and
    the tables they belong to (`config`, `model`)."""
    keys = flat_keys(location)
    tables = {key.rsplit(".", depth)[0] for key in keys for depth in range(1, key.count(".") + 1)}
    return keys | tables


def load(location: str, state: dict[str, Any], planner: Any = None) -> None:
    """torch.distributed.checkpoint's load of `location` into `state` (with `planner`, or
    torch's default one), in the layout either backend wrote (core.checkpoint_layout);
    CheckpointError says why it failed."""
    import torch.distributed.checkpoint as dcp

    from .checkpoint_layout import flatten, unflatten

    flat, places = flatten(state, flat_keys(location))
    try:
        dcp.load(flat, storage_reader=reader(location), planner=planner)
    except failures() as error:
        raise CheckpointError(f"cannot read checkpoint {location!r}: {reason(error)}") from None
    unflatten(flat, places)
