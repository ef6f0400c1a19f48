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
