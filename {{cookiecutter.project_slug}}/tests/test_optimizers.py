"""Optimizers from the config: state made before the first step, one graph, the same losses."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from {{ cookiecutter.package_name }}.core import health, make_plan, ops
from {{ cookiecutter.package_name }}.training import TrainConfig, fit
from {{ cookiecutter.package_name }}.training.optim import OPTIMIZERS, build_optimizer

from backend_facts import one_graph_per_step_kind
from training_helpers import TINY

OPTIONS: dict[str, dict[str, Any]] = {
    "adamw": {},
    "sgd": {"momentum": 0.9},
    "rmsprop": {"momentum": 0.5},
    "adafactor": {},
}
# Peak learning rates whose warm-up never passes exactly through a constant of the
# optimizer (Adafactor's eps 1e-3): torch_xla gives equal scalars one shared input, so
# such a step would trace a graph of its own (see docs/troubleshooting.md).
LR = {"adamw": 3e-3, "sgd": 0.05, "rmsprop": 1e-3, "adafactor": 3e-3}
STEPS = 6


def steps_on_device(name: str, primed: bool, device: Any, compiled: Any) -> tuple[list[float], int]:
    """Losses of STEPS steps of a small model, run as the backend runs a training step, and
    the graphs compiled after the first."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4)).to(device)
    config = TrainConfig(optimizer=name, lr=LR[name], optimizer_options=OPTIONS[name])
    optimizer = build_optimizer(model, config)
    if primed:
        ops.prime_optimizer_state(optimizer)
        ops.sync()
    data = torch.randn(STEPS, 16, 8, generator=torch.Generator().manual_seed(1))

    def train_step(x: torch.Tensor) -> torch.Tensor:
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    step = compiled(train_step)
    losses, compiled_after_first = [], 0
    for index, x in enumerate(data):
        before = health.snapshot()
        loss = step(x.to(device))
        ops.sync()
        losses.append(float(loss.item()))
        if index:
            compiled_after_first += health.snapshot().since(before).compilations
    return losses, compiled_after_first


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_primed_state_gives_the_unprimed_losses_and_one_graph(
    name: str, device: Any, compiled: Any
) -> None:
    """It makes the optimizer's own state before step 1: same losses, no second graph."""
    primed, primed_compiles = steps_on_device(name, True, device, compiled)
    plain, _ = steps_on_device(name, False, device, compiled)

    print(f"{name}: primed {primed}\n{name}: unprimed {plain}")
    torch.testing.assert_close(torch.tensor(primed), torch.tensor(plain), rtol=1e-6, atol=1e-7)
    assert primed_compiles == 0  # step 1 already ran the steady graph
    assert plain[-1] < plain[0]  # it trains


def test_priming_creates_only_what_the_optimizer_creates(device: Any) -> None:
    """It leaves SGD with momentum one buffer per parameter, and RMSprop its square_avg."""
    model = nn.Linear(4, 2).to(device)
    sgd = build_optimizer(model, TrainConfig(optimizer="sgd", optimizer_options={"momentum": 0.9}))
    ops.prime_optimizer_state(sgd)
    assert {tuple(state) for state in sgd.state.values()} == {("momentum_buffer",)}
    rms = build_optimizer(model, TrainConfig(optimizer="rmsprop"))
    ops.prime_optimizer_state(rms)
    assert all({"square_avg", "step"} <= set(state) for state in rms.state.values())
    assert all(float(state["step"]) == 0 for state in rms.state.values())


@pytest.fixture(scope="module", params=list(OPTIMIZERS))
def guarded_fit(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The task's fit with each optimizer, the guard armed after 2 steps: its summary."""
    name = request.param
    config = TrainConfig(
        **{**TINY, "accelerator": "cpu", "max_steps": 8, "log_every": 2,
           "run_dir": str(tmp_path_factory.mktemp(name))},
        optimizer=name,
        lr=LR[name],
        optimizer_options=OPTIONS[name],
    )  # fmt: skip
    return dict(fit(config, make_plan("cpu", 1, "single"), guard_after=2))


def test_fit_with_each_optimizer_compiles_nothing_after_warm_up(
    guarded_fit: dict[str, Any],
) -> None:
    """It trains the task with each optimizer and compiles nothing after warm-up (guarded)."""
    assert guarded_fit["guard"]["compilations"] == 0, guarded_fit["guard"]
    # Eight warm-up steps are too few to promise a lower loss on every task: that each
    # optimizer trains is the test above; here every step's loss must be a number.
    losses = [loss for _, loss in guarded_fit["train_losses"]]
    assert len(losses) == 4 and all(math.isfinite(loss) for loss in losses), losses


@one_graph_per_step_kind
def test_fit_with_each_optimizer_compiles_one_train_graph(guarded_fit: dict[str, Any]) -> None:
    """It compiles one train graph, or none if an earlier test in this process compiled it."""
    assert guarded_fit["loop_compilations"] <= 1


def test_task_hook_builds_its_own_optimizer(tmp_path: Path) -> None:
    """It uses a task's configure_optimizer instead of the config's optimizer."""
    from {{ cookiecutter.package_name }}.tasks import load_task

    task = load_task(TINY["task"], options=TINY["task_options"])
    made: list[torch.optim.Optimizer] = []

    def configure_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
        made.append(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
        return made[-1]

    task.configure_optimizer = configure_optimizer  # type: ignore[attr-defined]
    config = TrainConfig(**{**TINY, "accelerator": "cpu", "max_steps": 2, "run_dir": str(tmp_path)})
    fit(config, make_plan("cpu", 1, "single"), task=task)

    assert len(made) == 1 and isinstance(made[0], torch.optim.SGD)
    assert made[0].state  # primed and used


def test_unknown_optimizer_option_is_one_line() -> None:
    """It names the optimizer and the option it does not take."""
    from {{ cookiecutter.package_name }}.training.config import ConfigError

    config = TrainConfig(optimizer="sgd", optimizer_options={"betas": (0.9, 0.99)})
    with pytest.raises(ConfigError, match=r"optimizer 'sgd': .*betas"):
        build_optimizer(nn.Linear(2, 2), config)
