"""Evaluation averages per-sample metrics over real samples, or over the weight a task gives."""

from __future__ import annotations

from pathlib import Path

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


def evaluate(weighted: bool, tmp_path: Path, device: object) -> float:
    plan = make_plan("cpu", 1, "single")
    config = TrainConfig(accelerator="cpu", eval_batch_size=2, run_dir=str(tmp_path))
    task = WeightedTask(weighted)
    evaluator = Evaluator(task, plan.strategy, Precision.from_name("32-true"), config)  # type: ignore[arg-type]
    model = nn.Linear(1, 1).to(device)  # type: ignore[arg-type]
    return evaluator(model)["loss"]


def test_eval_means_are_weighted_by_the_tasks_weight(tmp_path: Path, device: object) -> None:
    """It averages over the weight (loss-carrying tokens) when given, else over samples."""
    weighted = sum(v * c for v, c in zip(VALUES, COUNTS, strict=True)) / sum(COUNTS)
    assert abs(evaluate(True, tmp_path, device) - weighted) < 1e-5
    assert abs(evaluate(False, tmp_path, device) - sum(VALUES) / len(VALUES)) < 1e-5
