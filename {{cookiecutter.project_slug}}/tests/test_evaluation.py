"""Evaluation averages per-sample metrics over real samples, or over the weight a task gives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from {{ cookiecutter.package_name }}.core import Precision, make_plan
from {{ cookiecutter.package_name }}.tasks import WEIGHT
from {{ cookiecutter.package_name }}.training import TrainConfig
from {{ cookiecutter.package_name }}.training.evaluation import Evaluator

VALUES = [1.0, 2.0, 3.0, 4.0, 5.0]
COUNTS = [0.0, 1.0, 1.0, 2.0, 12.0]  # per-sample tokens that carry loss (the first: none)


class Scored(Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return len(VALUES)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"value": torch.tensor(VALUES[index]), "count": torch.tensor(COUNTS[index])}


class WeightedTask:
    """A task whose per-sample metric is given, weighted by a count or not."""

    name = "weighted"

    def __init__(self, weighted: bool) -> None:
        self.weighted = weighted

    def eval_dataset(self) -> Scored:
        return Scored()

    def metrics(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        metrics = {"loss": batch["value"] + 0 * model(batch["value"][:, None]).sum()}
        return {**metrics, WEIGHT: batch["count"]} if self.weighted else metrics


def evaluator_of(weighted: bool, tmp_path: Path, **settings: int) -> Evaluator:
    plan = make_plan("cpu", 1, "single")
    config = TrainConfig(accelerator="cpu", run_dir=str(tmp_path), **settings)  # type: ignore[arg-type]
    return Evaluator(WeightedTask(weighted), plan.strategy, Precision.from_name("32-true"), config)  # type: ignore[arg-type]


def evaluate(weighted: bool, tmp_path: Path, device: object, eval_batch_size: int = 2) -> float:
    evaluator = evaluator_of(weighted, tmp_path, eval_batch_size=eval_batch_size)
    model = nn.Linear(1, 1).to(device)  # type: ignore[arg-type]
    return evaluator(model)["loss"]


def test_eval_means_are_weighted_by_the_tasks_weight(tmp_path: Path, device: object) -> None:
    """It averages over the weight (loss-carrying tokens) when given, else over samples."""
    weighted = sum(v * c for v, c in zip(VALUES, COUNTS, strict=True)) / sum(COUNTS)
    assert abs(evaluate(True, tmp_path, device) - weighted) < 1e-5
    assert abs(evaluate(False, tmp_path, device) - sum(VALUES) / len(VALUES)) < 1e-5


def test_eval_batch_defaults_to_the_training_batch_and_never_outgrows_the_split(
    tmp_path: Path, device: object
) -> None:
    """It evaluates at the training batch_size by default, capped at what the split fills
    (5 samples: one batch of 5, not 32 padded ones), with the same means."""
    assert evaluator_of(False, tmp_path, batch_size=4).batch_size == 4
    capped = evaluator_of(False, tmp_path, batch_size=32)
    assert capped.batch_size == capped.global_batch == len(VALUES)
    assert evaluator_of(False, tmp_path, batch_size=4, eval_batch_size=64).batch_size == 5
    for weighted in (True, False):
        assert evaluate(weighted, tmp_path, device, 64) == pytest.approx(
            evaluate(weighted, tmp_path, device, 2), abs=1e-6
        )


def test_eval_batches_caps_the_batches_an_evaluation_reads(tmp_path: Path, device: object) -> None:
    """It averages over the first `eval_batches` batches alone (2 of 3 here), and over every
    batch with 0."""
    model = nn.Linear(1, 1).to(device)  # type: ignore[arg-type]
    capped = evaluator_of(False, tmp_path, eval_batch_size=2, eval_batches=2)(model)["loss"]
    assert capped == pytest.approx(sum(VALUES[:4]) / 4, abs=1e-5)
    whole = evaluator_of(False, tmp_path, eval_batch_size=2, eval_batches=0)(model)["loss"]
    assert whole == pytest.approx(sum(VALUES) / len(VALUES), abs=1e-5)
