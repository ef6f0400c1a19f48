"""Checkpoint storage through torch.distributed.checkpoint: every process writes its own shards.

A checkpoint directory (`checkpoint_dir`: a local path or any fsspec URL, `gs://...`
through gcsfs) holds one folder per saved step, laid out as the torch_xla backend lays
it out: `.metadata`, the `.distcp` shards each process wrote (a DTensor's local shard:
FSDP2 and tensor-parallel parameters are saved sharded, and load into any other layout),
and `.manager_metadata`, written last by process 0 once every process's shards and the
metadata are whole. A folder without it was cut off mid-save and is ignored, so a crash
never costs the previous checkpoint. Reading needs only torch.
"""

from __future__ import annotations

import posixpath
import warnings
from typing import Any

_NOTES = (
    "TypedStorage is deprecated",
    "The function definition for SavePlanner",
    "torch.distributed is disabled, unavailable or uninitialized",  # one process reads
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
    """Steps with a whole checkpoint in `directory`, oldest first."""
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


def _reader(location: str) -> Any:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    return FsspecReader(location) if "://" in location else FileSystemReader(location)


def _flat_keys(location: str) -> set[str]:
    """The keys torch's planner flattened the saved state into (`config.lr`, ...)."""
    try:
        return set(_reader(location).read_metadata().state_dict_metadata)
    except failures() as error:  # a missing or foreign file: several exception types
        raise CheckpointError(f"cannot read checkpoint {location!r}: {reason(error)}") from None


def saved_keys(location: str) -> set[str]:
    """The flattened names of everything a checkpoint holds (`model.embed.weight`, ...) and
    the tables they belong to (`config`, `model`)."""
    keys = _flat_keys(location)
    tables = {key.rsplit(".", depth)[0] for key in keys for depth in range(1, key.count(".") + 1)}
    return keys | tables


def read(location: str, state: dict[str, Any]) -> None:
    """Load a checkpoint into `state` in place, resharding to the tensors' layout.

    Tensors in `state` receive the saved values (DTensors as they are sharded now,
    whatever the layout at save time); other entries are replaced by the saved objects
    (a `None` entry naming a table receives the whole table). Entries of the checkpoint
    that `state` does not name are not read.
    """
    import torch.distributed.checkpoint as dcp

    keys = _flat_keys(location)
    for name, value in list(state.items()):
        if value is None and name not in keys:
            state[name] = _table(name, keys)
    try:
        dcp.load(state, storage_reader=_reader(location), planner=_load_planner(state))
    except failures() as error:
        raise CheckpointError(f"cannot read checkpoint {location!r}: {reason(error)}") from None


def _table(name: str, keys: set[str]) -> dict[str, Any]:
    """The nested tables under `name` that the saved keys spell, their leaves None."""
    table: dict[str, Any] = {}
    for key in keys:
        if not key.startswith(f"{name}."):
            continue
        *path, leaf = key[len(name) + 1 :].split(".")
        inner = table
        for part in path:
            inner = inner.setdefault(part, {})
        inner[leaf] = None
    return table


def _load_planner(state: dict[str, Any]) -> Any:
    """torch's default planner: DTensors receive their shard, resharded from any layout."""
    return None


def _writer(location: str) -> Any:
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    return FsspecWriter(location) if "://" in location else FileSystemWriter(location)


class CheckpointStore:
    """Writes and restores steps of one checkpoint directory.

    `async_save` returns once the state is copied to host memory and writes it in the
    background (over a process group of its own, so the writes never meet the training's
    collectives); a second save waits for the first. Failures of background writes are
    raised at the next save or at `finish()`, as CheckpointError. `keep` whole steps stay.
    """

    def __init__(
        self, directory: str, keep: int, async_save: bool = True, preemption: bool = False
    ) -> None:
        import torch.distributed as dist

        from . import runtime

        runtime.init_process_group()
        # A group of its own: a background save's collectives run beside the step's.
        self.group = dist.new_group(backend="gloo") if runtime.world_size() > 1 else None
        self.master = runtime.global_ordinal() == 0
        self.directory = directory
        self.keep = keep
        self.async_save = async_save
        self.preemption = preemption
        try:
            fs, path = filesystem(directory)
            if self.master:
                fs.makedirs(path, exist_ok=True)
        except failures() as error:  # fsspec and the OS raise many types here
            raise CheckpointError(
                f"cannot use checkpoint directory {directory!r}: {reason(error)}"
            ) from None
        self._pending: list[tuple[int, Any]] = []  # (step, the save's Future)

    def steps(self) -> list[int]:
        return completed_steps(self.directory)

    def path(self, step: int) -> str:
        return join(self.directory, str(step))

    def save(self, step: int, state: dict[str, Any]) -> str:
        """Write `state` as `step` (in the background with async_save); return its path."""
        import torch.distributed.checkpoint as dcp

        self.finish()  # one save at a time; raises the failure of the previous one
        location = self.path(step)
        try:
            if self.async_save:
                future = dcp.async_save(
                    state, storage_writer=_writer(location), process_group=self.group
                )
                self._pending.append((step, future))
            else:
                dcp.save(state, storage_writer=_writer(location), process_group=self.group)
                self._commit(step)
        except failures() as error:
            raise CheckpointWriteError(
                f"cannot write checkpoint {location!r}: {reason(error)}"
            ) from None
        return location

    def _commit(self, step: int) -> None:
        """Mark `step` whole (process 0, after every shard and the metadata), keep `keep`."""
        if not self.master:
            return
        fs, path = filesystem(self.path(step))
        with fs.open(join(path, COMMIT_MARKER), "w") as marker:
            marker.write(str(step) + "\n")
        for old in self.steps()[: -self.keep]:
            fs.rm(join(filesystem(self.directory)[1], str(old)), recursive=True)

    def reached_preemption(self, step: int) -> bool:
        """No runtime preemption notice on this backend: SIGTERM stops the run (the loop)."""
        return False

    def raise_failures(self) -> None:
        """Raise the failure of a finished background save, once; mark the others whole."""
        done = [(step, f) for step, f in self._pending if f.done()]
        self._pending = [(step, f) for step, f in self._pending if not f.done()]
        for step, future in done:
            error = future.exception()
            if error is not None:
                raise CheckpointWriteError(
                    f"cannot write a checkpoint in {self.directory!r}: {reason(error)}"
                )
            self._commit(step)

    def finish(self) -> None:
        """Wait for background saves, and raise if one failed."""
        for _, future in self._pending:
            try:
                future.result()
            except failures():
                pass  # raised below, with the checkpoint's place
        self.raise_failures()
