"""Checkpoints: CPU tensors, one writer, atomic rename, last K kept, loadable anywhere."""

from __future__ import annotations

import os
import random
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core import ops

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


def rng_states() -> dict[str, Any]:
    """Every random generator a run draws from, in a form `weights_only` loading accepts."""
    py_version, py_state, _ = random.getstate()
    _, np_keys, np_pos, _, _ = np.random.get_state(legacy=True)  # type: ignore[misc]
    assert isinstance(np_keys, np.ndarray)
    return {
        "python_version": py_version,
        "python": list(py_state),
        "numpy": torch.from_numpy(np_keys.astype(np.int64)),
        "numpy_pos": int(np_pos),
        "torch": torch.get_rng_state(),
        "xla": ops.rng_state(),
    }


def restore_rng_states(rng: dict[str, Any]) -> None:
    """Put every generator back where `rng_states()` found it."""
    random.setstate((rng["python_version"], tuple(rng["python"]), None))
    np.random.set_state(
        ("MT19937", rng["numpy"].numpy().astype(np.uint32), rng["numpy_pos"], 0, 0.0)
    )
    torch.set_rng_state(rng["torch"])
    ops.set_rng_state(rng["xla"])
