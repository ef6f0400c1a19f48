"""Digit classification: a small CNN on scikit-learn's bundled 8x8 digits (no download).

`--data` takes an `.npz` file with `images` (N, H, W) and `labels` (N,) arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset


class ImageSet(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images = images
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.images[index], "y": self.labels[index]}


def load_arrays(source: str) -> tuple[np.ndarray, np.ndarray]:
    if source:
        with np.load(source) as arrays:
            return arrays["images"], arrays["labels"]
    from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.images, digits.target


class SmallCNN(nn.Module):
    def __init__(self, classes: int, width: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(2 * width * 16, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


@dataclass
class VisionTask:
    name = "vision"
    data: str = ""
    width: int = 16
    eval_fraction: float = 0.2
    split_seed: int = 0

    def __post_init__(self) -> None:
        images, labels = load_arrays(self.data)
        x = torch.tensor(images, dtype=torch.float32).unsqueeze(1)
        self.images = (x - x.mean()) / x.std()
        self.labels = torch.tensor(labels, dtype=torch.long)
        self.classes = int(self.labels.max()) + 1

    def build_model(self) -> nn.Module:
        return SmallCNN(self.classes, self.width)

    def _split(self) -> tuple[torch.Tensor, torch.Tensor]:
        order = torch.randperm(
            len(self.labels), generator=torch.Generator().manual_seed(self.split_seed)
        )
        cut = int(len(order) * (1 - self.eval_fraction))
        return order[:cut], order[cut:]

    def train_dataset(self) -> ImageSet:
        train = self._split()[0]
        return ImageSet(self.images[train], self.labels[train])

    def eval_dataset(self) -> ImageSet:
        held = self._split()[1]
        return ImageSet(self.images[held], self.labels[held])

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(model(batch["x"]).float(), batch["y"])

    def metrics(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        logits = model(batch["x"]).float()
        return {
            "loss": F.cross_entropy(logits, batch["y"], reduction="none"),
            "accuracy": (logits.argmax(dim=1) == batch["y"]).float(),
        }


def make_task(data: str = "", **options: object) -> VisionTask:
    return VisionTask(data=data, **options)  # type: ignore[arg-type]
