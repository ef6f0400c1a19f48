"""The step compiled once and run again (core/replay.py): torch_xla's trace-and-replay on one
XLA:CPU device, and the trainer's step under fsdp, replayed or not, on either backend."""

from __future__ import annotations

import json
{% if cookiecutter.backend == "torch_xla" -%}
from collections.abc import Callable
{% endif -%}
{% if cookiecutter.backend == "torch_tpu" -%}
from pathlib import Path
{% endif -%}
from typing import Any

import pytest
{%- if cookiecutter.backend == "torch_xla" %}
import torch

from {{ cookiecutter.package_name }}.core import ReplayedStep, health
{%- endif %}

{% if cookiecutter.example_task == "lm" -%}
from backend_facts import COMPILED_DRAWS_AS_EAGER, many, one_graph_per_step_kind
{%- else -%}
from backend_facts import many, one_graph_per_step_kind
{%- endif %}
from training_helpers import TINY, cli, write_config

# Dropout where the example has it: each replayed step must draw new numbers (where the
# compiled step draws as the eager one, as the losses of the two are compared).
{% if cookiecutter.example_task == "lm" -%}
NOISE: dict[str, Any] = {"dropout": 0.1} if COMPILED_DRAWS_AS_EAGER else {}
{%- else -%}
NOISE: dict[str, Any] = {}
{%- endif %}
{%- if cookiecutter.backend == "torch_xla" %}


# torch_xla only: its ReplayedStep traces the step twice and replays the graph (torch_tpu's
# compiles the step with torch.compile, whose caching is dynamo's).
class Counter:
    """A step over state `weight` and `moment`, counting how often its Python runs."""

    def __init__(self, device: Any) -> None:
        import torch_xla

        self.weight = torch.nn.Parameter(torch.zeros(4, device=device))
        self.moment = torch.zeros(4, device=device)
        self.calls = 0
        torch_xla.sync()  # device data, as a model's weights are before training

    def state(self) -> list[torch.Tensor]:
        return [self.weight, self.moment]

    def step(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        self.calls += 1
        with torch.no_grad():
            self.weight.add_(x)
            self.moment.mul_(0.5).add_(self.weight)
        return {"total": self.weight.sum() * 2.0, "first": self.moment[0]}


def run(step: Callable[[torch.Tensor], Any], steps: int, device: Any) -> list[list[float]]:
    """Call `step` on inputs 1..steps uploaded as the trainer uploads batches."""
    import torch_xla

    outputs = []
    for value in range(1, steps + 1):
        out = step((torch.arange(4.0) * value).to(device))
        torch_xla.sync()
        outputs.append([out["total"].item(), out["first"].item()])
    return outputs


def expected(steps: int) -> list[list[float]]:
    weight, moment, rows = torch.zeros(4), torch.zeros(4), []
    for value in range(1, steps + 1):
        weight += torch.arange(4.0) * value
        moment = moment * 0.5 + weight
        rows.append([float(weight.sum() * 2.0), float(moment[0])])
    return rows


def test_it_traces_twice_then_replays_one_compiled_graph(device: Any) -> None:
    """It runs the step's Python twice, compiles one graph, and replays it with the state."""
    counter = Counter(device)
    step = ReplayedStep(counter.step, counter.state)
    before = health.snapshot()
    outputs = run(step, 6, device)
    flat = [value for row in outputs for value in row]
    assert flat == pytest.approx([value for row in expected(6) for value in row])
    assert counter.calls == 2 and step.phase == "replay" and step.reason is None
    assert health.snapshot().since(before).compilations == 1
    assert counter.weight.cpu().tolist() == (torch.arange(4.0) * 21).tolist()  # 1 + ... + 6


def test_the_replayed_step_hands_the_buffers_of_the_state_it_updates_to_the_new_state(
    device: Any,
) -> None:
    """It compiles the step with the state it updates donated to its outputs: the device
    holds that state once, not its old and new values side by side. A frozen tensor the step
    only reads keeps its buffer."""
    import torch_xla

    X = torch_xla._XLAC
    counter = Counter(device)
    frozen = torch.full((4,), 3.0, device=device)
    torch_xla.sync()

    def reading(x: torch.Tensor) -> dict[str, torch.Tensor]:
        return counter.step(x * frozen)

    step = ReplayedStep(reading, lambda: [*counter.state(), frozen])
    run(step, 3, device)  # a capture, a verifying trace, a replay
    assert step.phase == "replay" and step.reason is None
    _, old = X._get_tensors_xla_device_data_node([counter.weight, counter.moment, frozen])
    run(step, 1, device)  # the input of step 1 again
    assert counter.weight.cpu().tolist() == (torch.arange(4.0) * 3 * (1 + 2 + 3 + 1)).tolist()
    for buffer in old[:2]:
        with pytest.raises(RuntimeError, match=r"deleted|HasValue"):  # given away
            buffer.cpu()
    assert old[2].cpu().tolist() == [3.0] * 4


def test_the_replayed_step_keeps_the_buffer_of_a_number_it_updates(device: Any) -> None:
    """It gives away no scalar's buffer: torch_xla uploads a number once and hands that
    buffer to every later upload of the same number (a resumed run's step counts)."""
    import torch_xla

    count = torch.tensor(7.0).to(device)  # the buffer of every upload of 7.0 from now on
    torch_xla.sync()

    def counting(x: torch.Tensor) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            count.add_(x.sum())
        return {"count": count * 1.0}

    step = ReplayedStep(counting, lambda: [count])
    totals = []
    for _ in range(4):  # a capture, a verifying trace, two replays
        out = step(torch.ones(2).to(device))
        torch_xla.sync()
        totals.append(out["count"].item())
    assert step.phase == "replay" and totals == [9.0, 11.0, 13.0, 15.0]
    assert torch.tensor(7.0).to(device).cpu().item() == 7.0


def test_a_step_that_reads_the_device_is_traced_every_time(device: Any) -> None:
    """It gives up replaying a step whose branch depends on a device value, and stays right."""
    counter = Counter(device)

    def branchy(x: torch.Tensor) -> dict[str, torch.Tensor]:
        out = counter.step(x)
        if counter.weight.sum().item() > 10:  # a device read: frozen by a replay
            out["total"] = out["total"] * 0
        return out

    outputs = run(ReplayedStep(branchy, counter.state), 4, device)
    want = [row[0] if row[0] <= 20 else 0.0 for row in expected(4)]  # total = 2 x the sum
    assert [row[0] for row in outputs] == want and want.count(0.0) == 3
    step = ReplayedStep(branchy, counter.state)
    step(torch.ones(4).to(device))
    assert step.reason == "the step reads the device (a data-dependent branch)"


def test_a_host_number_that_changes_is_never_frozen_into_the_graph(device: Any) -> None:
    """It compares the constants of its two traces and traces every step when one changes."""
    counter = Counter(device)
    scale = iter([1.5, 2.5, 3.5, 4.5, 5.5])

    def scaled(x: torch.Tensor) -> dict[str, torch.Tensor]:
        out = counter.step(x)
        out["total"] = out["total"] * next(scale)  # a Python number, new at each step
        return out

    step = ReplayedStep(scaled, counter.state)
    outputs = run(step, 5, device)
    factors = [1.5, 2.5, 3.5, 4.5, 5.5]
    assert [row[0] for row in outputs] == pytest.approx(
        [row[0] * f for row, f in zip(expected(5), factors, strict=True)]
    )
    assert step.reason == "the step takes a host value that changes from one step to the next"


def test_a_step_that_keeps_tensors_outside_its_state_is_traced_every_time(
    device: Any,
) -> None:
    """It refuses to replay a step that leaves a result on the side, which replay would lose."""
    counter = Counter(device)
    kept: list[torch.Tensor] = []

    def keeping(x: torch.Tensor) -> dict[str, torch.Tensor]:
        out = counter.step(x)
        kept.append(counter.moment * 10)
        return out

    step = ReplayedStep(keeping, counter.state)
    run(step, 3, device)
    assert step.reason == "the step keeps tensors it neither updates nor returns"
    assert kept[-1].cpu().tolist() == pytest.approx((counter.moment.cpu() * 10).tolist())


def test_random_numbers_follow_the_same_stream_replayed_or_traced(device: Any) -> None:
    """It feeds each replayed step the device's seed, as a traced step draws it."""
    import torch_xla
    import torch_xla.core.xla_model as xm

    def draws(reason: str | None) -> list[list[float]]:
        xm.set_rng_state(1234)
        noise = torch.zeros(3, device=device)
        torch_xla.sync()

        def noisy(x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                noise.add_(torch.rand(3, device=device) + x)
            return noise * 1.0

        step = ReplayedStep(noisy, lambda: [noise], reason=reason)
        rows = []
        for _ in range(5):
            out = step(torch.zeros(3).to(device))
            torch_xla.sync()
            rows.append(out.cpu().tolist())
        assert step.reason == reason
        return rows

    replayed, traced = draws(None), draws("traced for reference")
    assert replayed == traced
    assert len({tuple(row) for row in replayed}) == 5  # a new draw at every step
{%- endif %}


{%- if cookiecutter.backend == "torch_tpu" %}


def test_every_run_of_a_process_compiles_its_step(tmp_path: Path) -> None:
    """It compiles each run's step afresh, as a new process would: dynamo keeps 8 compiled
    versions of a function, and a process's ninth run would otherwise run its step eagerly."""
    from {{ cookiecutter.package_name }}.core import make_plan
    from {{ cookiecutter.package_name }}.training import TrainConfig, fit

    plan = make_plan("cpu", 1, "single")
    counts = []
    for run in range(10):
        settings = {**TINY, "max_steps": 2, "accelerator": "cpu", "goodput": "off"}
        config = TrainConfig(**settings, run_dir=str(tmp_path / str(run)))
        counts.append(fit(config, plan)["compilations"])
    assert counts[0] > 0 and counts == [counts[0]] * 10, counts
{%- endif %}


@pytest.fixture(scope="module")
def replayed_and_traced(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The fsdp run of 8 steps (two micro-batches each), its step replayed, and the same run
    traced at every step (`replay_step = false`): their summaries."""
    folder = tmp_path_factory.mktemp("replay")
    options = {**TINY["task_options"], **NOISE}
    config = write_config(folder, max_steps=8, log_every=1, grad_accum=2, task_options=options)
    runs = {}
    for replay in ("true", "false"):
        run_dir = folder / replay
        done = cli(
            "train", "--config", str(config), "--run-dir", str(run_dir), *many("fsdp"),
            "--set", f"replay_step={replay}",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        runs[replay] = json.loads((run_dir / "summary.json").read_text())
    return runs


@pytest.mark.slow
def test_the_trainer_replays_its_step_with_the_traced_losses(
    replayed_and_traced: dict[str, Any],
) -> None:
    """It replays the fsdp step after its warm-up (two micro-batches each): the losses of
    tracing every step, and no device read but the logged losses."""
    replayed, traced = replayed_and_traced["true"], replayed_and_traced["false"]
    reads = replayed["step"].pop("warmup_reads")
    assert replayed["step"] == {"replayed": True, "traced_because": None}
    assert traced["step"] == {
        "replayed": False,
        "traced_because": "replay_step = false",
        "warmup_reads": 0,
    }
    assert [step for step, _ in replayed["train_losses"]] == list(range(1, 9))
    assert [loss for _, loss in replayed["train_losses"]] == pytest.approx(
        [loss for _, loss in traced["train_losses"]], rel=1e-5
    )
    # One loss read a step; the replayed run adds the reads its warm-up reports, at most one.
    assert traced["loop_transfers"] == 8 and replayed["loop_transfers"] == 8 + reads <= 9
    assert replayed["host_ms_per_step"] > 0


@pytest.mark.slow
@one_graph_per_step_kind
def test_the_replayed_trainer_step_is_one_graph(replayed_and_traced: dict[str, Any]) -> None:
    """It compiles one train graph for the replayed fsdp step."""
    assert replayed_and_traced["true"]["loop_compilations"] == 1
