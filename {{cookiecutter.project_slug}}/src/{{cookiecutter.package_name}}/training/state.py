"""What a checkpoint holds beyond weights: progress through the run and every RNG."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..core import ops


@dataclass
class Progress:
    """Host-side position in the run: what a checkpoint must restore."""

    step: int = 0
    epoch: int = 0
    batches_done: int = 0  # optimizer steps already taken in `epoch`
    losses: list[tuple[int, float]] = field(default_factory=list)
    best: float = math.inf

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "epoch": self.epoch,
            "batches_done": self.batches_done,
            "losses": [list(item) for item in self.losses],
            "best": self.best,
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Progress:
        return cls(
            step=int(state["step"]),
            epoch=int(state["epoch"]),
            batches_done=int(state["batches_done"]),
            losses=[(int(s), float(v)) for s, v in state["losses"]],
            best=float(state["best"]),
        )


# The device generator's entry: its state means something to the backend that wrote it only.
DEVICE_RNG = "xla"


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
        DEVICE_RNG: ops.rng_state(),
    }


def restore_rng_states(rng: dict[str, Any], device: bool = True) -> None:
    """Put every generator back where `rng_states()` found it (the host's alone: `device`
    False, for a checkpoint another backend wrote)."""
    random.setstate((rng["python_version"], tuple(rng["python"]), None))
    np.random.set_state(
        ("MT19937", rng["numpy"].numpy().astype(np.uint32), rng["numpy_pos"], 0, 0.0)
    )
    torch.set_rng_state(rng["torch"])
    if device:
        ops.set_rng_state(rng[DEVICE_RNG])


def restart_device_rng(seed: int, step: int) -> None:
    """Seed the device generator from the run's seed and step: a resumed run another backend
    started draws the same numbers every time it resumes there, and not step 0's again."""
    ops.set_rng_state((seed * 1_000_003 + step) % 2**63)
