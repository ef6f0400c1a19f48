"""Strategies resolve as documented, and spmd on 8 devices trains like one device."""

import json
import os
import sys
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from {{ cookiecutter.package_name }}.core import (
    DeviceFeeder,
    Plan,
    RuntimeConfigError,
    launch,
    make_plan,
    runtime,
)
from {{ cookiecutter.package_name }}.core.launcher import parse_devices

SPMD_DEVICES = 8
GLOBAL_BATCH = 64


def test_auto_strategy_emulates_many_cpu_devices_with_spmd():
    """It picks spmd for several XLA:CPU devices and single for one."""
    assert make_plan("cpu", 8) == Plan("cpu", "spmd", 8)
    assert make_plan("cpu", "8", "auto") == Plan("cpu", "spmd", 8)
    assert make_plan("cpu", 1) == Plan("cpu", "single", 1)


def test_ddp_on_several_cpu_devices_points_to_spmd():
    """It refuses ddp over several XLA:CPU devices and names --strategy spmd instead."""
    with pytest.raises(RuntimeConfigError, match="--strategy spmd"):
        make_plan("cpu", 8, "ddp")


@pytest.mark.parametrize("devices", ["0", "-1", "two", "1.5", "[a]", "[]", ""])
def test_bad_devices_are_rejected(devices):
    """It rejects a devices value that is not a count, 'all' or one core id."""
    with pytest.raises(RuntimeConfigError, match="invalid devices"):
        make_plan("cpu", devices)


def test_unknown_strategy_is_rejected_with_the_choices():
    """It rejects an unknown strategy and lists the valid ones."""
    with pytest.raises(RuntimeConfigError, match=r"unknown strategy 'fsdp'.*single, ddp, spmd"):
        make_plan("cpu", 1, "fsdp")


def test_one_core_id_selects_that_chip_on_tpu(monkeypatch, restore_environ):
    """It parses '[5]' as one device on core 5 and exposes only that chip to PJRT."""
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    assert parse_devices("[5]") == (1, 5)

    plan = make_plan("tpu", "[5]")
    assert plan == Plan("tpu", "single", 1, core=5)

    runtime.configure(plan.accelerator, tpu_core=plan.core)
    assert os.environ["TPU_VISIBLE_CHIPS"] == "5"
    assert os.environ["TPU_PROCESS_BOUNDS"] == "1,1,1"


def test_one_core_id_needs_a_tpu():
    """It refuses a core id on XLA:CPU and says what to use instead."""
    with pytest.raises(RuntimeConfigError, match="--devices 1"):
        make_plan("cpu", "[5]")


def training_step(strategy: str) -> dict[str, Any]:
    """One SGD step of a tiny MLP on one fixed full batch; runs inside `launch`."""
    import torch_xla

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    inputs, targets = torch.randn(GLOBAL_BATCH, 6), torch.randn(GLOBAL_BATCH, 2)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=GLOBAL_BATCH)
    model.to(torch_xla.device())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)

    shardings = []
    for x, y in DeviceFeeder(loader, strategy).epoch(0):
        shardings.append(torch_xla._XLAC._get_xla_sharding_spec(x))
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        torch_xla.sync()
    return {
        "devices": runtime.global_device_count(),
        "addressable_devices": runtime.addressable_device_count(),
        "batch_sharding": shardings,
        "params": [p.detach().cpu().tolist() for p in model.parameters()],
    }


@pytest.fixture(scope="module")
def spmd_run(python_subprocess):
    """The training step under spmd on 8 XLA:CPU devices, in a fresh runtime."""
    result = python_subprocess(
        [__file__, "spmd"], env={"CPU_NUM_DEVICES": str(SPMD_DEVICES)}, unset=("XLA_USE_BF16",)
    )
    print(f"spmd run: {result['devices']} devices")
    return result


def test_spmd_launch_runs_on_eight_cpu_devices(spmd_run):
    """It runs an spmd launch on 8 XLA:CPU devices and shards the batch over all of them."""
    assert spmd_run["devices"] == SPMD_DEVICES
    assert spmd_run["addressable_devices"] == SPMD_DEVICES
    assert spmd_run["batch_sharding"] == ["{devices=[8,1]0,1,2,3,4,5,6,7}"]


def test_spmd_step_matches_single_device_step(spmd_run, restore_environ):
    """It gives the same parameters after one step on 8 sharded devices as on one."""
    single = launch(training_step, make_plan("cpu", 1, "single"), args=("single",))

    assert single["batch_sharding"] == [""]
    for sharded, reference in zip(spmd_run["params"], single["params"], strict=True):
        torch.testing.assert_close(
            torch.tensor(sharded), torch.tensor(reference), rtol=1e-5, atol=1e-5
        )


if __name__ == "__main__":
    # Child mode for `spmd_run`: SPMD is process-wide and must start before any XLA tensor.
    strategy = sys.argv[1]
    print(json.dumps(launch(training_step, make_plan("cpu", SPMD_DEVICES, strategy), (strategy,))))
