"""A task whose training data is a stream trains across epochs, sharded like any other."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import IterableDataset

from {{ cookiecutter.package_name }}.core import make_plan
from {{ cookiecutter.package_name }}.tasks import load_task
from {{ cookiecutter.package_name }}.training import ConfigError, TrainConfig, fit

from training_helpers import TINY

SAMPLES = 40
STEPS = 12


class Stream(IterableDataset):  # type: ignore[type-arg]
    """The first SAMPLES samples of a map-style dataset, read in order, epoch after epoch."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __iter__(self) -> Iterator[Any]:
        return (self.dataset[i] for i in range(SAMPLES))


class StreamingTask:
    """The project's task, its training set streamed."""

    def __init__(self) -> None:
        self.task = load_task(TINY["task"], options=TINY["task_options"])
        self.stream = Stream(self.task.train_dataset())
        self.name = self.task.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self.task, name)

    def train_dataset(self) -> Stream:
        return self.stream


def test_streaming_task_trains_across_epochs(tmp_path: Path) -> None:
    """It trains a stream for max_steps, starting it again (with set_epoch) at each epoch."""
    task = StreamingTask()
    config = TrainConfig(
        **{**TINY, "accelerator": "cpu", "max_steps": STEPS, "log_every": 1}, run_dir=str(tmp_path)
    )
    # The guard, armed from step 2, fails the run if an epoch boundary compiles a graph.
    plan = make_plan("cpu", 1, "single")
    summary = fit(config, plan, task=task, guard_after=2)  # type: ignore[arg-type]

    per_epoch = SAMPLES // TINY["batch_size"]
    epochs = (STEPS - 1) // per_epoch  # the epoch the last step is in
    assert summary["steps"] == STEPS and summary["epochs"] == epochs >= 2
    assert task.stream.epochs[: epochs + 1] == list(range(epochs + 1))
    assert summary["guard"]["armed_at_step"] <= per_epoch  # it watched a new epoch start
    assert summary["guard"]["compilations"] == 0


def test_streaming_task_needs_max_steps(tmp_path: Path) -> None:
    """It refuses epochs for a stream, which has no length, in one line."""
    config = TrainConfig(**{**TINY, "accelerator": "cpu"}, run_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="set max_steps instead of max_epochs"):
        fit(config, make_plan("cpu", 1, "single"), task=StreamingTask())  # type: ignore[arg-type]


class StatefulStream(Stream):
    """A stream that says where it is (`state_dict`) and starts there (`load_state_dict`)."""

    def __init__(self, dataset: Any) -> None:
        super().__init__(dataset)
        self.position = 0
        self.resume_from = 0
        self.starts: list[int] = []  # where each pass over the stream began

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.resume_from = state["position"]

    def __iter__(self) -> Iterator[Any]:
        start, self.resume_from = self.resume_from, 0
        self.starts.append(start)
        for index in range(start, SAMPLES):
            self.position = index + 1
            yield self.dataset[index]


class StatefulStreamingTask(StreamingTask):
    def __init__(self) -> None:
        super().__init__()
        self.stream = StatefulStream(self.task.train_dataset())


def resume_twice(tmp_path: Path, make_task: Any) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """An unbroken run, and a run resumed from its checkpoint at step RESUME_AT (mid-epoch)."""
    settings = {**TINY, "accelerator": "cpu", "max_steps": STEPS, "log_every": 1, "seed": 3,
                "checkpoint_every": RESUME_AT, "keep_checkpoints": 9}  # fmt: skip
    plan = make_plan("cpu", 1, "single")
    whole = fit(TrainConfig(**settings, run_dir=str(tmp_path / "a")), plan, task=make_task())
    task = make_task()
    checkpoint = str(tmp_path / "a" / "checkpoints" / str(RESUME_AT))
    config = TrainConfig(**settings, run_dir=str(tmp_path / "b"), resume=checkpoint)
    return whole, fit(config, plan, task=task), task


RESUME_AT = 7  # of 5 steps per epoch: the third batch of epoch 1


@pytest.mark.slow
def test_stream_with_state_resumes_from_its_state(tmp_path: Path) -> None:
    """It restores a stream's saved state, read after the last trained batch: losses equal."""
    whole, resumed, task = resume_twice(tmp_path, StatefulStreamingTask)
    per_epoch = SAMPLES // TINY["batch_size"]
    assert resumed["train_losses"] == whole["train_losses"]
    # a probe of the shapes at start-up, then the stream from its saved position
    assert task.stream.starts[:2] == [0, (RESUME_AT % per_epoch) * TINY["batch_size"]]


@pytest.mark.slow
def test_stream_without_state_is_replayed_with_a_warning(tmp_path: Path) -> None:
    """It reads a stream without state again to skip the trained batches, and says the cost."""
    with pytest.warns(UserWarning, match=r"reading 2 batches again to skip them"):
        whole, resumed, _ = resume_twice(tmp_path, StreamingTask)
    assert resumed["train_losses"] == whole["train_losses"]
