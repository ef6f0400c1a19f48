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

from typing import Any

from . import checkpoint_files as files
from .checkpoint_files import saved_keys as saved_keys


def read(location: str, state: dict[str, Any]) -> None:
    """Load a checkpoint into `state` in place, resharding to the tensors' layout.

    Tensors in `state` receive the saved values (DTensors as they are sharded now,
    whatever the layout at save time); other entries are replaced by the saved objects
    (a `None` entry naming a table receives the whole table). Entries of the checkpoint
    that `state` does not name are not read. Either backend's checkpoints read here.
    """
    files.load(location, state, _load_planner(state))


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
            fs, path = files.filesystem(directory)
            if self.master:
                fs.makedirs(path, exist_ok=True)
        except files.failures() as error:  # fsspec and the OS raise many types here
            raise files.CheckpointError(
                f"cannot use checkpoint directory {directory!r}: {files.reason(error)}"
            ) from None
        self._pending: list[tuple[int, Any]] = []  # (step, the save's Future)

    def steps(self) -> list[int]:
        return files.completed_steps(self.directory)

    def path(self, step: int) -> str:
        return files.join(self.directory, str(step))

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
        except files.failures() as error:
            raise files.CheckpointWriteError(
                f"cannot write checkpoint {location!r}: {files.reason(error)}"
            ) from None
        return location

    def _commit(self, step: int) -> None:
        """Mark `step` whole (process 0, after every shard and the metadata), keep `keep`."""
        if not self.master:
            return
        fs, path = files.filesystem(self.path(step))
        with fs.open(files.join(path, files.COMMIT_MARKER), "w") as marker:
            marker.write(str(step) + "\n")
        for old in self.steps()[: -self.keep]:
            fs.rm(files.join(files.filesystem(self.directory)[1], str(old)), recursive=True)

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
                raise files.CheckpointWriteError(
                    f"cannot write a checkpoint in {self.directory!r}: {files.reason(error)}"
                )
            self._commit(step)

    def finish(self) -> None:
        """Wait for background saves, and raise if one failed."""
        for _, future in self._pending:
            try:
                future.result()
            except files.failures():
                pass  # raised below, with the checkpoint's place
        self.raise_failures()
