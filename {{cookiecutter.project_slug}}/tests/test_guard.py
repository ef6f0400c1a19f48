"""The step guard over real training: silent on a healthy fit, loud on recompiles and syncs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from {{ cookiecutter.package_name }}.core import HealthError, make_plan, ops
from {{ cookiecutter.package_name }}.tasks import load_task
from {{ cookiecutter.package_name }}.training import TrainConfig, fit

from backend_facts import TRAIN_GRAPHS_ONE_DEVICE, TRANSFER
from training_helpers import TINY

# Batch sizes no other test uses, so this module's graphs compile here, cold; the
# training and eval sets are not multiples of them (checked below).
{% if cookiecutter.example_task in ("lm", "hf-causal-lm") -%}
SETTINGS: dict[str, Any] = {
    **TINY,
    "batch_size": 7,
    "eval_batch_size": 12,
    "task_options": {**TINY["task_options"], "max_bytes": 6000},
}
{%- else -%}
SETTINGS: dict[str, Any] = {**TINY, "batch_size": 13, "eval_batch_size": 28}
{%- endif %}
PLAN = make_plan("cpu", 1, "single")


def make_config(run_dir: Path, **overrides: Any) -> TrainConfig:
    return TrainConfig(**{**SETTINGS, "accelerator": "cpu", "run_dir": str(run_dir), **overrides})


class ItemInLoss:
    """The project's task with a classic bug: a NaN check that reads the loss every step."""

    def __init__(self, task: Any) -> None:
        self.task = task
        self.name = task.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self.task, name)

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        loss = self.task.loss(model, batch)
        if loss.item() != loss.item():  # a device-to-host transfer in every step
            raise FloatingPointError("loss is NaN")
        return loss


@pytest.fixture(scope="module")
def two_epochs(tmp_path_factory: pytest.TempPathFactory) -> tuple[TrainConfig, Any, Any]:
    """A fit of 2 epochs with evals on ragged-length data, the guard armed after the first
    eval: its config, task and summary."""
    config = make_config(tmp_path_factory.mktemp("epochs"), max_epochs=2, eval_every=40,
                         log_every=10)  # fmt: skip
    task = load_task(config.task, options=config.task_options)
    assert len(task.train_dataset()) % config.batch_size != 0
    assert len(task.eval_dataset()) % config.eval_batch_size != 0
    return config, task, fit(config, PLAN, task=task, guard_after=2)


def test_multi_epoch_fit_with_eval_passes_the_guard(
    two_epochs: tuple[TrainConfig, Any, Any],
) -> None:
    """It fits 2 epochs with evals on ragged-length data inside the guard: no graph compiled
    after warm-up, the epoch boundary included, and no read beyond the allowed ones."""
    config, task, summary = two_epochs
    assert summary["status"] == "completed"
    assert summary["steps"] == 2 * (len(task.train_dataset()) // config.batch_size)
    guard = summary["guard"]
    assert guard is not None and guard["armed_at_step"] == 40  # after the first eval
    assert guard["armed_at_step"] < summary["steps"] // 2  # the epoch boundary is guarded
    assert guard["compilations"] == 0 and guard["transfers"] <= guard["allowed_transfers"]
    assert summary["fallback_ops"] == {}


def test_multi_epoch_fit_with_eval_compiles_each_graph_once(
    two_epochs: tuple[TrainConfig, Any, Any],
) -> None:
    """It compiles the train step's graphs and one eval step graph once for the whole fit."""
    assert two_epochs[2]["compilations"] == TRAIN_GRAPHS_ONE_DEVICE + 1


def test_guard_fails_the_fit_on_an_item_in_the_step(tmp_path: Path) -> None:
    """It stops the fit at the next logging step, naming the host sync."""
    config = make_config(tmp_path, max_steps=40, log_every=10)
    task = ItemInLoss(load_task(config.task, options=config.task_options))
    with pytest.raises(HealthError, match=rf"{TRANSFER}.*\.item\(\)") as error:
        fit(config, PLAN, task=task, guard_after=2)

    assert str(error.value).startswith("step 10: ")  # failed fast, not at the end of the run
    assert "compiled" not in str(error.value)


def test_guard_fails_on_a_ragged_batch_after_warm_up(
    step_guard: Any, device: Any, compiled: Any
) -> None:
    """It passes a warm step and fails when a shorter batch compiles a new graph."""
    task = load_task(SETTINGS["task"], options=SETTINGS["task_options"])
    torch.manual_seed(0)
    model = task.build_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = next(iter(DataLoader(task.train_dataset(), batch_size=SETTINGS["batch_size"] + 2)))
    full = {k: v.to(device) for k, v in batch.items()}
    ragged = {k: v[:-3] for k, v in full.items()}
    loss = compiled(lambda data: task.loss(model, data))

    def step(data: dict[str, torch.Tensor]) -> None:
        optimizer.zero_grad()
        loss(data).backward()
        optimizer.step()
        ops.sync()

    for _ in range(2):
        step(full)
    with step_guard():
        step(full)
    with pytest.raises(HealthError, match=r"new graph\(s\) compiled after warm-up"), step_guard():
        step(ragged)
