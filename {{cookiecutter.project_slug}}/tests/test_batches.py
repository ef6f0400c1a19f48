"""Batches reach the device only as tensors; anything else fails early and clearly."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from {{ cookiecutter.package_name }}.core import DeviceFeeder
from {{ cookiecutter.package_name }}.core.strategies import SingleDevice

from backend_facts import DEVICE_TYPE

ONE_DEVICE = SingleDevice("cpu", 1)


class WithIds(Dataset[dict[str, object]]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> dict[str, object]:
        return {"x": torch.ones(4), "id": f"sample-{index}"}


def test_string_in_batch_is_named_before_any_transfer(device: torch.device) -> None:
    """It raises TypeError naming the offending key and type when the feeder is built."""
    loader = DataLoader(WithIds(), batch_size=4)
    with pytest.raises(TypeError, match=r"batch\['id'\]\[0\] is a str, not a tensor"):
        DeviceFeeder(loader, ONE_DEVICE)


def test_tensor_batches_reach_the_device(device: torch.device) -> None:
    """It feeds dict batches of tensors to the device unchanged in shape."""
    loader = DataLoader([{"x": torch.ones(4)} for _ in range(8)], batch_size=4)
    batches = list(DeviceFeeder(loader, ONE_DEVICE).epoch(0))
    assert len(batches) == 2
    assert batches[0]["x"].device.type == DEVICE_TYPE
    assert nn.Linear(4, 1).to(device)(batches[0]["x"]).shape == (4, 1)
