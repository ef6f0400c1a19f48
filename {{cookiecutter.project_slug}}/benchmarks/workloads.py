"""The benchmark's workloads: what each trains, for how long, on how many devices.

Every contender of a workload trains the same model on the same data with the same batch
size and the defaults of `TrainConfig` (`CONFIG`): AdamW, warm-up + cosine schedule,
gradient clipping at 1.0, fp32, the loss read every `LOG_EVERY` steps.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from {{ cookiecutter.package_name }}.tasks import load_task
from {{ cookiecutter.package_name }}.training import TrainConfig

WARMUP_STEPS = 3  # the training loop's own timer also starts after step 3
LOG_EVERY = 20
CONFIG = TrainConfig()  # the defaults every contender copies
WORKLOADS = {
    # name: (steps per run, rounds, devices, contenders)
    "mlp": (128, 5, 1, ("hand-written", "trainer", "accelerate")),
    "task": (43, 3, 1, ("hand-written", "trainer", "accelerate")),
    "spmd": (64, 3, 8, ("hand-written", "trainer")),
    "fsdp": (32, 3, 8, ("hand-written", "trainer")),
    "ckpt": (60, 3, 1, ("trainer", "trainer+sync saves", "trainer+async saves")),
}
CHECKPOINT_EVERY = 10  # the ckpt workload: steps/s while saving this often
STRATEGY = {"spmd": "spmd", "fsdp": "fsdp"}  # workload -> strategy; the rest: one device
FSDP_BATCH = 4  # per device: the task's global batch of 32 over 8 devices
DEPTHS = "2,8,24"  # blocks of the depth sweep
DEPTH_STEPS = 8


class Pairs(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "y": self.y[index]}


class MlpTask:
    """An MLP 64-256-10 on synthetic data: 4096 samples, 32 steps of 128 per epoch."""

    name = "mlp"
    batch_size = 128

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(5120, 64, generator=generator)
        self.y = torch.randint(0, 10, (5120,), generator=generator)

    def build_model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))

    def train_dataset(self) -> Pairs:
        return Pairs(self.x[:4096], self.y[:4096])

    def eval_dataset(self) -> Pairs:
        return Pairs(self.x[4096:], self.y[4096:])

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(model(batch["x"]), batch["y"])

    def metrics(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"loss": F.cross_entropy(model(batch["x"]), batch["y"], reduction="none")}


def make_workload(name: str) -> Any:
    if name in ("mlp", "spmd"):
        return MlpTask()
    task = load_task(CONFIG.task)
    task.batch_size = FSDP_BATCH if name == "fsdp" else CONFIG.batch_size
    return task


def log_reads(steps: int) -> int:
    """Loss reads at the logging cadence, the last step included (as the training loop logs)."""
    return steps // LOG_EVERY + (1 if steps % LOG_EVERY else 0)
