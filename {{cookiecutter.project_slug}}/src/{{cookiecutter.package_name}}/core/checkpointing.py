"""Checkpoint storage through torch.distributed.checkpoint: every host writes its own shards.

A checkpoint directory (`checkpoint_dir`: a local path or any fsspec URL, `gs://...`
through gcsfs) holds one folder per saved step, laid out by torch_xla's
CheckpointManager: `.metadata`, the `.distcp` shards each process wrote, and
`.manager_metadata`, written last. A folder without it was cut off mid-save and is
ignored, so a crash never costs the previous checkpoint. Reading needs only torch; the
torch_tpu backend's checkpoints read and resume here too (core.checkpoint_layout).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from . import checkpoint_files as files
from .checkpoint_files import saved_keys as saved_keys


def read(location: str, state: dict[str, Any]) -> None:
    """Load a checkpoint into `state` in place, resharding to the tensors' layout.

    Tensors in `state` receive the saved values (on XLA devices as they are sharded
    now, whatever the layout at save time); other entries are replaced by the saved
    objects (a `None` entry naming a table receives the whole table). Entries of the
    checkpoint that `state` does not name are not read. Either backend's checkpoints read here.
    """
    files.load(location, state, _load_planner(state))


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
            with _quiet_about_other_markers():
                self.manager = CheckpointManager(
                    directory,
                    save_interval=1,
                    max_to_keep=keep,
                    process_group=group,
                    chkpt_on_preemption=preemption,
                )
            _track_other_backends_steps(self.manager, directory)
        except files.failures() as error:  # fsspec and the OS raise many types here
            raise files.CheckpointError(
                f"cannot use checkpoint directory {directory!r}: {files.reason(error)}"
            ) from None
        self._checked = 0  # futures already inspected

    def steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def path(self, step: int) -> str:
        return files.join(self.directory, str(step))

    def save(self, step: int, state: dict[str, Any]) -> str:
        """Write `state` as `step` (in the background with async_save); return its path."""
        self.raise_failures()
        try:
            if self.async_save:
                self.manager.save_async(step, _frozen(state), force=True)
            else:
                self.manager.save(step, state, force=True)
        except files.failures() as error:
            raise files.CheckpointWriteError(
                f"cannot write checkpoint {self.path(step)!r}: {files.reason(error)}"
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
                raise files.CheckpointWriteError(
                    f"cannot write a checkpoint in {self.directory!r}: {files.reason(error)}"
                )

    def finish(self) -> None:
        """Wait for background saves, and raise if one failed."""
        self.manager.join()
        self.raise_failures()


class _OtherMarkers(logging.Filter):
    """Drops CheckpointManager's warning about step folders without its own marker: a
    half-written step is ignored by design, and a whole one the torch_tpu backend wrote is
    tracked below."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Ignoring invalid checkpoints")


@contextmanager
def _quiet_about_other_markers() -> Iterator[None]:
    root, drop = logging.getLogger(), _OtherMarkers()
    root.addFilter(drop)  # CheckpointManager warns through the root logger
    try:
        yield
    finally:
        root.removeFilter(drop)


def _track_other_backends_steps(manager: Any, directory: str) -> None:
    """Whole steps the torch_tpu backend wrote (its marker is the step, not CheckpointManager's
    record) join the tracked ones as the oldest: listed, resumed from, and counted by `keep`."""
    from torch_xla.experimental.distributed_checkpoint.manager import _CheckpointMetadata

    tracked = set(manager.all_steps())
    for step in reversed(files.completed_steps(directory)):
        if step not in tracked:
            manager._tracked_chkpts.appendleft(_CheckpointMetadata(step=step, ts=datetime.min))


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
