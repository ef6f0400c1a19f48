"""Strategies resolve as documented, refuse bad requests, and train like one device."""

{% if cookiecutter.backend == "torch_xla" -%}
import json
import re
import sys
from typing import Any

{% endif -%}
import pytest
{% if cookiecutter.backend == "torch_xla" -%}
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
{% endif %}
{% if cookiecutter.backend == "torch_xla" -%}
from {{ cookiecutter.package_name }}.core import DeviceFeeder, RuntimeConfigError, launch, make_plan, ops
from {{ cookiecutter.package_name }}.core.launcher import parse_devices
from {{ cookiecutter.package_name }}.core.strategies import (
    DataParallelProcesses,
    FullyShardedDataParallel,
    SingleDevice,
    SpmdDataParallel,
    parse_mesh,
)
{%- else -%}
from {{ cookiecutter.package_name }}.core import RuntimeConfigError, make_plan
from {{ cookiecutter.package_name }}.core.strategies import FullyShardedDataParallel, parse_mesh
{%- endif %}

import backend_facts

MESH_DEVICES = 8  # the job the mesh requests are planned for (nothing starts)
GLOBAL_BATCH = 64


def test_auto_strategy_runs_many_cpu_devices_replicated_and_one_alone():
    """It picks the replicated strategy (spmd on torch_xla, ddp on torch_tpu) for several CPU
    devices and single for one."""
    many = backend_facts.MANY_DEVICES
    assert make_plan("cpu", many).strategy.name == backend_facts.REPLICATED
    assert make_plan("cpu", str(many), "auto").strategy.name == backend_facts.REPLICATED
    assert make_plan("cpu", 1).strategy.name == "single"
{%- if cookiecutter.backend == "torch_xla" %}
    assert make_plan("cpu", 8).strategy == SpmdDataParallel("cpu", 8)
    assert make_plan("cpu", 1).strategy == SingleDevice("cpu", 1)


# torch_xla only: its `auto` on a TPU host (torch_tpu's is ddp wherever it runs: test_backend.py)
# and its refusal of ddp over XLA:CPU devices (torch_tpu runs ddp on CPU processes).
def test_auto_strategy_on_a_multi_device_tpu_host_is_spmd(monkeypatch):
    """It picks spmd, not ddp, for every device of a TPU host; ddp stays explicit."""
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    assert isinstance(make_plan("tpu", "all").strategy, SpmdDataParallel)
    assert isinstance(make_plan("tpu", 4).strategy, SpmdDataParallel)
    assert isinstance(make_plan("tpu", 4, "ddp").strategy, DataParallelProcesses)


def test_ddp_on_several_cpu_devices_points_to_spmd():
    """It refuses ddp over several XLA:CPU devices and names --strategy spmd instead."""
    with pytest.raises(RuntimeConfigError, match="--strategy spmd"):
        make_plan("cpu", 8, "ddp")
{%- endif %}


@pytest.mark.parametrize("devices", ["0", "-1", "two", "1.5", "[a]", "[]", ""])
def test_bad_devices_are_rejected(devices):
    """It rejects a devices value that is not a count, 'all' or one core id."""
    with pytest.raises(RuntimeConfigError, match="invalid devices"):
        make_plan("cpu", devices)


def test_unknown_strategy_is_rejected_with_the_choices():
    """It rejects an unknown strategy and lists the valid ones."""
    choices = r"unknown strategy 'zero'.*" + ", ".join(backend_facts.STRATEGIES)
    with pytest.raises(RuntimeConfigError, match=choices):
        make_plan("cpu", 1, "zero")


{%- if cookiecutter.backend == "torch_xla" %}


# torch_xla only: the chip is chosen through PJRT's variables, with PJRT_DEVICE=TPU standing
# in for a TPU (torch_tpu needs TPU device files and torch_tpu itself to plan for a TPU).
def test_one_core_id_selects_that_chip_on_tpu(monkeypatch, restore_environ):
    """It parses '[5]' as one device on core 5 and exposes only that chip to PJRT."""
    import os

    from {{ cookiecutter.package_name }}.core import runtime

    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    assert parse_devices("[5]") == (1, 5)

    plan = make_plan("tpu", "[5]")
    assert (plan.strategy, plan.core) == (SingleDevice("tpu", 1, 5), 5)

    runtime.configure(plan.accelerator, tpu_core=plan.core)
    assert os.environ["TPU_VISIBLE_CHIPS"] == "5"
    assert os.environ["TPU_PROCESS_BOUNDS"] == "1,1,1"
{%- endif %}


def test_one_core_id_needs_a_tpu():
    """It refuses a core id on XLA:CPU and says what to use instead."""
    with pytest.raises(RuntimeConfigError, match="--devices 1"):
        make_plan("cpu", "[5]")


def test_mesh_parses_in_mesh_order():
    """It reads `axis=size` pairs and orders them data, then fsdp."""
    assert parse_mesh("fsdp=4, data=2") == (("data", 2), ("fsdp", 4))
    assert parse_mesh("") == ()
    plan = make_plan("cpu", 8, "fsdp", "data=2,fsdp=4")
    assert isinstance(plan.strategy, FullyShardedDataParallel)
    assert plan.strategy.mesh_request == (("data", 2), ("fsdp", 4))


BAD_MESHES = {
    "unknown-axis": ("fsdp", "model=8", "unknown mesh axis 'model'"),
    "wrong-product": ("fsdp", "data=2,fsdp=2", "has 4 devices but the job has 8"),
    "zero-size": ("fsdp", "fsdp=0", "positive size"),
    "no-size": ("fsdp", "fsdp", "axis=size"),
    "twice": ("fsdp", "fsdp=4,fsdp=2", "given twice"),
    "fsdp-without-fsdp-axis": ("fsdp", "data=8", "needs a 'fsdp' axis"),
{%- if cookiecutter.backend == "torch_xla" %}
    "spmd-with-fsdp-axis": ("spmd", "fsdp=8", "use --strategy fsdp"),
{%- endif %}
    "mesh-for-ddp": ("ddp", "data=1", "a mesh is for strateg.*, not 'ddp'"),
}


@pytest.mark.parametrize("strategy,mesh,message", BAD_MESHES.values(), ids=BAD_MESHES.keys())
def test_bad_mesh_is_refused_before_anything_starts(strategy, mesh, message):
    """It refuses a mesh with an unknown axis or the wrong size, naming the fix."""
    devices = 1 if strategy == "ddp" else MESH_DEVICES
    with pytest.raises(RuntimeConfigError, match=message):
        make_plan("cpu", devices, strategy, mesh)


{%- if cookiecutter.backend == "torch_xla" %}


# torch_xla only: how SPMD shards the batch and the parameters over 8 devices of one process
# (torch_xla's sharding specs). torch_tpu's layouts give the one-process losses in
# test_distributed.py.
def training_steps(strategy_name: str, devices: int) -> dict[str, Any]:
    """Three AdamW steps of a small MLP on fixed full batches; runs inside `launch`."""
    import torch_xla

    strategy = make_plan("cpu", devices, strategy_name).strategy
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    inputs, targets = torch.randn(GLOBAL_BATCH * 3, 6), torch.randn(GLOBAL_BATCH * 3, 2)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=GLOBAL_BATCH)
    model, _ = strategy.setup_model(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    ops.prime_optimizer_state(optimizer)
    strategy.place_optimizer_state(optimizer)

    shardings, losses = [], []
    for x, y in DeviceFeeder(loader, strategy).epoch(0):
        shardings.append(torch_xla._XLAC._get_xla_sharding_spec(x))
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        torch_xla.sync()
        losses.append(loss.item())
    state = strategy.model_state_dict(model)
    return {
        "batch_sharding": shardings,
        "param_sharding": [torch_xla._XLAC._get_xla_sharding_spec(p) for p in model.parameters()],
        "losses": losses,
        "params": {name: value.cpu().tolist() for name, value in state.items()},
    }


@pytest.fixture(scope="module", params=["spmd", "fsdp"])
def eight_device_run(request, python_subprocess):
    """The training steps on 8 XLA:CPU devices under spmd or fsdp, in a fresh runtime."""
    env = {"CPU_NUM_DEVICES": str(MESH_DEVICES)}
    result = python_subprocess([__file__, request.param], env=env, unset=("XLA_USE_BF16",))
    return request.param, result


def test_eight_devices_shard_the_batch_and_fsdp_the_parameters(eight_device_run):
    """It splits each batch over all 8 devices; fsdp also splits every weight matrix."""
    strategy, run = eight_device_run
    assert run["batch_sharding"] == ["{devices=[8,1]0,1,2,3,4,5,6,7}"] * 3
    weights = run["param_sharding"][0::2]
    # fsdp splits each matrix along its longest dimension.
    expected = r"\{devices=\[(8,1|1,8)\]" if strategy == "fsdp" else r"\{replicated\}"
    assert all(re.match(expected, spec) for spec in weights), weights


def test_eight_device_steps_match_single_device_steps(eight_device_run, restore_environ):
    """It gives the same losses and parameters on 8 sharded devices as on one."""
    _, run = eight_device_run
    single = launch(training_steps, make_plan("cpu", 1, "single"), args=("single", 1))

    assert single["batch_sharding"] == [""] * 3
    assert run["params"].keys() == single["params"].keys()  # no wrapper names in the state
    torch.testing.assert_close(torch.tensor(run["losses"]), torch.tensor(single["losses"]))
    for name, reference in single["params"].items():
        torch.testing.assert_close(
            torch.tensor(run["params"][name]), torch.tensor(reference), rtol=1e-5, atol=1e-5
        )


if __name__ == "__main__":
    # Child mode for `eight_device_run`: SPMD is process-wide and starts before any XLA tensor.
    name = sys.argv[1]
    plan = make_plan("cpu", MESH_DEVICES, name)
    print(json.dumps(launch(training_steps, plan, (name, MESH_DEVICES))))
{%- endif %}
