"""Checkpoint storage through torch.distributed.checkpoint: every host writes its own shards.

A checkpoint directory (`checkpoint_dir`: a local path or any fsspec URL, `gs://...`
through gcsfs) holds one folder per saved step, laid out by torch_xla's
CheckpointManager: `.metadata`, the `.distcp` shards each process wrote, and
`.manager_metadata`, written last. A folder without it was cut off mid-save and is
ignored, so a crash never costs the previous checkpoint. Reading needs only torch.
"""

from __future__ import annotations

import posixpath
import warnings
from concurrent.futures import Future
from typing import Any

# Notes torch and torch_xla print on every save or load about their own internals.
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
    """Steps with a whole checkpoint in `directory`, oldest first (no torch_xla needed)."""
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


def saved_keys(location: str) -> set[str]:
    """The flattened names of everything a checkpoint holds (`model.embed.weight`, ...)."""
    try:
        return set(_reader(location).read_metadata().state_dict_metadata)
    except failures() as error:  # a missing or foreign file: several exception types
        raise CheckpointError(f"cannot read checkpoint {location!r}: {reason(error)}") from None


def read(location: str, state: dict[str, Any]) -> None:
    """Load a checkpoint into `state` in place, resharding to the tensors' layout.

    Tensors in `state` receive the saved values (on XLA devices as they are sharded
    now, whatever the layout at save time); other entries are replaced by the saved
    objects. Entries of the checkpoint that `state` does not name are not read.
    """
    import torch.distributed.checkpoint as dcp

    try:
        dcp.load(state, storage_reader=_reader(location), planner=_load_planner(state))
    except failures() as error:
        raise CheckpointError(f"cannot read checkpoint {location!r}: {reason(error)}") from None


def _load_planner(state: dict[str, Any]) -> Any:
    """torch_xla's planner when XLA tensors receive the data (it reshards), else torch's."""
    from torch.utils._pytree import tree_leaves

    on_xla = any(getattr(t, "device", None) is not None and t.device.type == "xla"
                 for t in tree_leaves(state))  # fmt: skip
    if not on_xla:
        return None
    import torch_xla.experimental.distributed_checkpoint as xc

    return xc.SPMDLoadPlanner()


class CheckpointStore:
    """Writes and restores steps of one checkpoint directory (CheckpointManager).

    `async_save` returns once the state is copied to host memory and writes it in the
    background; a second save waits for the first. Failures of background writes are
    raised at the next save or at `finish()`, as CheckpointError.
    """

    def __init__(
        self, directory: str, keep: int, async_save: bool = True, preemption: bool = False
    ) -> None:
        from torch_xla.experimental.distributed_checkpoint import CheckpointManager

        from . import checkpoint_planner, runtime

        checkpoint_planner.install()  # every shard written once (see checkpoint_planner)

        group = runtime.host_group()  # the process group DCP coordinates the hosts over
        self.directory = directory
        self.async_save = async_save
        self.preemption = preemption
        try:
            self.manager = CheckpointManager(
                directory,
                save_interval=1,
                max_to_keep=keep,
                process_group=group,
                chkpt_on_preemption=preemption,
            )
        except failures() as error:  # fsspec and the OS raise many types here
            raise CheckpointError(
                f"cannot use checkpoint directory {directory!r}: {reason(error)}"
            ) from None
        self._checked = 0  # futures already inspected

    def steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def path(self, step: int) -> str:
        return join(self.directory, str(step))

    def save(self, step: int, state: dict[str, Any]) -> str:
        """Write `state` as `step` (in the background with async_save); return its path."""
        self.raise_failures()
        try:
            if self.async_save:
                self.manager.save_async(step, _frozen(state), force=True)
            else:
                self.manager.save(step, state, force=True)
        except failures() as error:
            raise CheckpointWriteError(
                f"cannot write checkpoint {self.path(step)!r}: {reason(error)}"
            ) from None
        return self.path(step)

    def reached_preemption(self, step: int) -> bool:
        """True on every host at the same step once the TPU runtime was told of preemption."""
        return self.preemption and bool(self.manager.reached_preemption(step))

    def raise_failures(self) -> None:
        """Raise the first failure of a finished background save, once."""
        futures: list[Future[Any]] = self.manager._async_futures
        for future in futures[self._checked :]:
            if not future.done():
                break
            self._checked += 1
            error = future.exception()
            if error is not None:
                raise CheckpointWriteError(
                    f"cannot write a checkpoint in {self.directory!r}: {reason(error)}"
                )

    def finish(self) -> None:
        """Wait for background saves, and raise if one failed."""
        self.manager.join()
        self.raise_failures()


def _frozen(state: dict[str, Any]) -> dict[str, Any]:
    """The state as it is now, for a background write: host tensors copied, containers new.

    save_async copies device tensors to the host before it returns, but keeps host tensors
    (an optimizer's `step` counts) by reference: the next step would change them in place
    before they are written, and a resumed run would count one step too many.
    """
    import torch
    from torch.utils._pytree import tree_map

    def copy(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.device.type == "cpu":
            return value.clone()
        return value

    return dict(tree_map(copy, state))
