"""SIGTERM on this backend: a job of several processes stops at one step, saved (exit 75),
and resumed from there trains the unbroken job's losses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gates import Gate
from training_helpers import cli, preempt_then_resume, write_config

pytestmark = pytest.mark.slow  # runs of two processes: `make test-fast` skips them

STEPS = 16
DDP_X2 = {
    "devices": 2,
    "strategy": "ddp",
    "batch_size": 4,
    "log_every": 1,
    "seed": 5,
    "max_steps": STEPS,
}


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    """The losses of the job run to its end without a stop."""
    folder = tmp_path_factory.mktemp("unbroken")
    config = write_config(folder, **DDP_X2)
    done = cli("train", "--config", str(config), "--run-dir", str(folder / "run"))
    assert done.returncode == 0, done.stderr[-3000:]
    return list(json.loads((folder / "run" / "summary.json").read_text())["train_losses"])


@pytest.mark.interrupts
@pytest.mark.parametrize("signalled", ["the-launcher", "every-process"])
def test_sigterm_stops_a_ddp_job_at_one_saved_step_and_the_resume_matches(
    signalled: str, unbroken: list[Any], gated_src: Path, tmp_path: Path
) -> None:
    """SIGTERM to the launching process (which sends it on) or to every process (a VM going
    down): the two processes agree on a step, save it and stop, the job exits 75, and
    `--resume auto` ends with the unbroken job's losses."""
    gate = Gate(tmp_path / "gate", steps=8)  # SIGTERM while step 9's data is held
    config = write_config(tmp_path, gate=gate, **DDP_X2)
    run_dir = tmp_path / "run"
    args = ("train", "--config", str(config), "--run-dir", str(run_dir))
    every = signalled == "every-process"
    resumed = preempt_then_resume(args, run_dir, gate, gated_src, every_process=every)
    assert (resumed["devices"], resumed["strategy"]) == (2, "ddp")
    assert resumed["train_losses"] == unbroken
