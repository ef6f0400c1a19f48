"""One checkpoint, both backends: a run of torch_xla continues on torch_tpu and the other way.

The other backend runs in its own environment: OTHER_BACKEND_PYTHON names its interpreter
(torch_xla 2.9 for a torch_tpu bake, torch 2.13 for a torch_xla one) and OTHER_BACKEND_SRC
the `src` folder of the same project baked for it. Without them these tests skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from backend_facts import NAME
from training_helpers import SRC, TINY, write_config

PACKAGE = "{{ cookiecutter.package_name }}"
PYTHON_VARIABLE, SRC_VARIABLE = "OTHER_BACKEND_PYTHON", "OTHER_BACKEND_SRC"
SAVED, STEPS, SEED = 10, 20, 0
# Several end-to-end runs, in two environments: `make test-fast` skips them.
slow = pytest.mark.slow
# What the project promises a layout against one device, and the torch_tpu bake against one
# process on a pod (tests/test_fsdp.py): the two backends' losses agree far closer (~2e-7).
TOLERANCE = 2e-3


def test_a_checkpoint_reads_in_either_backends_layout(device: Any, tmp_path: Path) -> None:
    """It reads tables saved whole (torch_xla's layout) or split into their entries (torch's)
    into the same state on the device, a table asked for as None included."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultSavePlanner

    from {{ cookiecutter.package_name }}.core.checkpointing import read

    config = {"seed": 3, "task_options": {"dim": 32}, "loggers": ["tensorboard"]}
    groups = [{"lr": 0.5, "betas": (0.9, 0.99), "params": [0]}]
    split = {"model": {"w": torch.arange(4.0)}, "config": config, "groups": groups}
    whole = {"model.w": torch.arange(4.0), "config": config, "groups": groups}
    dcp.save(split, checkpoint_id=tmp_path / "split")
    dcp.save(whole, checkpoint_id=tmp_path / "whole",
             planner=DefaultSavePlanner(flatten_state_dict=False))  # fmt: skip
    for layout in ("split", "whole"):
        state: dict[str, Any] = {
            "model": {"w": torch.zeros(4, device=device)},
            "config": {"seed": 0, "task_options": {"dim": 0}, "loggers": []},
            "groups": [{"lr": 0.0, "betas": (0.0, 0.0), "params": [0]}],
        }
        read(str(tmp_path / layout), state)
        assert torch.equal(state.pop("model")["w"].cpu(), torch.arange(4.0)), layout
        assert state == {"config": config, "groups": groups}, layout
        header: dict[str, Any] = {"config": None}
        read(str(tmp_path / layout), header)
        assert header["config"]["task_options"] == {"dim": 32}, layout


@dataclass(frozen=True)
class Backend:
    """Where a run of one backend happens: its interpreter and the project's source for it."""

    name: str
    python: str
    src: Path

    def train(self, folder: Path, *args: str, **overrides: Any) -> subprocess.CompletedProcess[str]:
        """A tiny lm run logging every step's loss, checkpointed at step SAVED."""
        config = write_config(
            folder, max_steps=SAVED, log_every=1, seed=SEED, checkpoint_every=SAVED, **overrides
        )
        command = [self.python, "-m", PACKAGE, "train", "--config", str(config), *args]
        env = {**os.environ, "PYTHONPATH": str(self.src), "PYTHONUNBUFFERED": "1"}
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def here() -> Backend:
    return Backend(NAME, sys.executable, SRC)


@pytest.fixture(scope="module")
def other() -> Backend:
    """The other backend's environment, as the two variables name it (else the tests skip)."""
    python, src = os.environ.get(PYTHON_VARIABLE, ""), os.environ.get(SRC_VARIABLE, "")
    if not python or not src:
        pytest.skip(
            f"no environment of the other backend: set {PYTHON_VARIABLE} (its interpreter) "
            f"and {SRC_VARIABLE} (the src folder of this project baked for it)"
        )
    if not Path(python).is_file() or not (Path(src) / PACKAGE).is_dir():
        pytest.fail(f"{PYTHON_VARIABLE}={python!r} or {SRC_VARIABLE}={src!r} does not exist")
    asked = subprocess.run(
        [python, "-c", f"from {PACKAGE}.core.tpu_generations import BACKEND; print(BACKEND)"],
        env={**os.environ, "PYTHONPATH": src}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert asked.returncode == 0, asked.stderr[-3000:]
    name = asked.stdout.strip()
    assert name != NAME, f"{SRC_VARIABLE} is a {name} bake, like this one: not the other backend"
    return Backend(name, python, Path(src))


def train(backend: Backend, folder: Path, *args: str, **overrides: Any) -> dict[str, Any]:
    """A run of `backend` that must succeed; its stdout and summary."""
    done = backend.train(folder, "--run-dir", str(folder / "run"), *args, **overrides)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((folder / "run" / "summary.json").read_text())
    return {"stdout": done.stdout, **summary}


def checkpointed(backend: Backend, folder: Path) -> Path:
    """`backend` trains SAVED steps; its checkpoint directory."""
    first = train(backend, folder)
    assert [step for step, _ in first["train_losses"]] == list(range(1, SAVED + 1))
    return folder / "run" / "checkpoints"


@pytest.fixture(scope="module")
def saved_there(other: Backend, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return checkpointed(other, tmp_path_factory.mktemp(f"saved-{other.name}"))


@pytest.fixture(scope="module")
def saved_here(here: Backend, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return checkpointed(here, tmp_path_factory.mktemp(f"saved-{here.name}"))


def resumed(backend: Backend, checkpoints: Path, folder: Path) -> dict[str, Any]:
    """`backend` resumes a copy of `checkpoints` and trains to STEPS."""
    shutil.copytree(checkpoints, folder / "run" / "checkpoints")
    return train(backend, folder, "--max-steps", str(STEPS), "--resume", "latest")


@pytest.fixture(scope="module")
def continued_here(
    here: Backend, saved_there: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    return resumed(here, saved_there, tmp_path_factory.mktemp("continued-here"))


@pytest.fixture(scope="module")
def continued_there(
    other: Backend, saved_here: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    return resumed(other, saved_here, tmp_path_factory.mktemp("continued-there"))


def unbroken(backend: Backend, folder: Path) -> list[list[float]]:
    return list(train(backend, folder, "--max-steps", str(STEPS))["train_losses"])


def assert_same_losses(resumed: dict[str, Any], reference: list[list[float]]) -> None:
    """Steps SAVED+1..STEPS of the resumed run are the unbroken run's, within TOLERANCE."""
    after = [(step, loss) for step, loss in resumed["train_losses"] if step > SAVED]
    assert [step for step, _ in after] == list(range(SAVED + 1, STEPS + 1)), after
    for (step, loss), (_, expected) in zip(after, reference[SAVED:], strict=True):
        assert loss == pytest.approx(expected, rel=TOLERANCE), step


@slow
def test_a_run_of_the_other_backend_continues_here_as_if_unbroken(
    continued_here: dict[str, Any], here: Backend, tmp_path: Path
) -> None:
    """It resumes the other backend's checkpoint at step 10 here: steps 11..20 lose what 20
    unbroken steps here lose."""
    assert f"resuming at step {SAVED} " in continued_here["stdout"]
    assert_same_losses(continued_here, unbroken(here, tmp_path))


@slow
def test_a_run_of_this_backend_continues_on_the_other_as_if_unbroken(
    continued_there: dict[str, Any], other: Backend, tmp_path: Path
) -> None:
    """It gives the other backend a checkpoint at step 10 that it continues: steps 11..20
    lose what 20 unbroken steps there lose."""
    assert f"resuming at step {SAVED} " in continued_there["stdout"]
    assert_same_losses(continued_there, unbroken(other, tmp_path))


@slow
def test_crossing_backends_restarts_the_device_rng_in_one_line(
    continued_here: dict[str, Any], continued_there: dict[str, Any], here: Backend, other: Backend
) -> None:
    """It says once, each way, that the device RNG state stays behind and restarts from the
    seed at the step resumed."""
    for run, start, then in ((continued_here, other, here), (continued_there, here, other)):
        said = [line for line in run["stdout"].splitlines() if "RNG" in line]
        assert said == [
            f"checkpoint written by {start.name}: its device RNG state does not carry to "
            f"{then.name}; restarted from seed {SEED} at step {SAVED}"
        ], run["stdout"][-3000:]


@slow
def test_another_model_from_the_other_backend_is_refused_in_one_line(
    saved_there: Path, here: Backend, tmp_path: Path
) -> None:
    """It refuses the other backend's checkpoint of a model of another width, in one line."""
    options = {k: 2 * v if k in ("dim", "width") else v for k, v in TINY["task_options"].items()}
    shutil.copytree(saved_there, tmp_path / "run" / "checkpoints")
    done = here.train(tmp_path, "--run-dir", str(tmp_path / "run"), "--max-steps", str(STEPS),
                      "--resume", "latest", task_options=options)  # fmt: skip
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot read checkpoint "), lines
    assert "size mismatch" in lines[0].lower(), lines
