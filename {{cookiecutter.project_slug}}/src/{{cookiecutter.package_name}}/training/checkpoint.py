"""Checkpoints: CPU tensors, one writer, atomic rename, last K kept, loadable anywhere."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..core import Strategy, ops
from .state import Progress, rng_states

FORMAT = "{{ cookiecutter.package_name }}-checkpoint"
VERSION = 1
_NAME = re.compile(r"^step-(\d{8})\.pt$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message says which file and why."""


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (temp files are never listed)."""
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _NAME.match(p.name))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def save_checkpoint(
    state: dict[str, Any], run_dir: str | Path, step: int, keep: int, name: str | None = None
) -> Path:
    """Write CPU `state` atomically as step-N.pt (or `name`); keep the newest `keep`."""
    folder = checkpoint_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / (name or f"step-{step:08d}.pt")
    payload = {"format": FORMAT, "version": VERSION, **state}
    fd, tmp_name = tempfile.mkstemp(prefix=".tmp-", suffix=".pt", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    for old in list_checkpoints(run_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return target


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint on CPU (no torch_xla needed); CheckpointError if unusable."""
    source = Path(path)
    if not source.is_file():
        raise CheckpointError(f"checkpoint {str(source)!r} does not exist")
    try:
        state = torch.load(source, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for a corrupt or foreign file
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"cannot read checkpoint {str(source)!r}: {reason[:160]}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(
            f"{str(source)!r} is not a checkpoint of this project (no {FORMAT!r} marker)"
        )
    if state.get("version") != VERSION:
        raise CheckpointError(
            f"{str(source)!r} has checkpoint version {state.get('version')}, expected {VERSION}"
        )
    return state


class Checkpointer:
    """Saves a run's full state: weights, optimizer, schedule, progress and every RNG."""

    def __init__(
        self,
        run_dir: str,
        keep: int,
        strategy: Strategy,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        config: dict[str, Any],
        host_read: Callable[[], AbstractContextManager[None]],
    ) -> None:
        self.run_dir = run_dir
        self.keep = keep
        self.strategy = strategy
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.config = config
        self.host_read = host_read

    def state(self, progress: Progress) -> dict[str, Any]:
        return {
            "model": ops.to_cpu(self.strategy.model_state_dict(self.model)),
            "optimizer": ops.to_cpu(self.optimizer.state_dict()),
            "scheduler": self.scheduler.state_dict(),
            "progress": progress.to_dict(),
            "config": self.config,
            "rng": rng_states(),
        }

    def save(self, progress: Progress, name: str | None = None) -> Path | None:
        """Write a checkpoint from the master process; every process waits for it."""
        ops.sync()
        path = None
        if self.strategy.is_master():
            with self.host_read():
                state = self.state(progress)
            path = save_checkpoint(state, self.run_dir, progress.step, self.keep, name)
        self.strategy.barrier("checkpoint")
        return path
