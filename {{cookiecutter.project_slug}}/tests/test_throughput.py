"""Throughput a user can read: the rates in every log line, FLOPs counted once, MFU on TPU."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from {{ cookiecutter.package_name }}.core import make_plan, runtime
from {{ cookiecutter.package_name }}.training import TrainConfig, fit
from {{ cookiecutter.package_name }}.training.throughput import Meter, Peak, count_flops

from training_helpers import TINY


class LinearTask:
    """A task whose FLOPs are known: one 16x8 matmul forward, one (the weight's) backward."""

    def build_model(self) -> nn.Module:
        return nn.Linear(16, 8, bias=False)

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.mse_loss(model(batch["x"]), batch["y"])


def test_flops_are_counted_on_the_meta_device(device: Any) -> None:
    """It counts the loss's forward and backward FLOPs: 2 x 2 x batch x in x out here."""
    # (As in a run, the XLA device is in use first: autograd must know it before any
    # backward pass, the meta one included.)
    sample = {"x": torch.randn(32, 16), "y": torch.randn(32, 8)}
    flops = count_flops(LinearTask(), sample)  # type: ignore[arg-type]
    assert flops == 2 * 2 * 32 * 16 * 8


def test_mfu_divides_model_flops_by_the_chips_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    """It compares FLOPs/s with chips x peak bf16 FLOPs from the TPU table (TPU only)."""
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v4-8")
    peak = Peak.of_job("tpu")
    assert peak is not None
    devices = runtime.global_device_count()
    assert peak.flops_per_second == devices * runtime.peak_bf16_flops_per_chip("v4-8")
    rates = Meter(64, 128, 10**12, peak).rates(2.0)
    assert rates["samples_per_s"] == 128 and rates["tokens_per_s"] == 128 * 128
    assert rates["mfu"] == pytest.approx(2 * 10**12 / peak.flops_per_second)
    assert Peak.of_job("cpu") is None
    assert "mfu" not in Meter(64, None, 10**12, None).rates(2.0)


def test_every_log_line_has_the_rates_and_the_summary_the_first_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It logs steps/s, samples/s and FLOPs/s (tokens/s for text) and times the first step."""
    # A batch size no other test uses: this process has compiled no graph of this shape,
    # so the first step must compile.
    options = {**TINY, "accelerator": "cpu", "max_steps": 6, "log_every": 2}
    config = TrainConfig(**{**options, "batch_size": TINY["batch_size"] + 3}, run_dir=str(tmp_path))
    summary: dict[str, Any] = fit(config, make_plan("cpu", 1, "single"))
    printed = capsys.readouterr().out

    assert "first step: " in printed and "of which compiling" in printed
    lines = [line for line in printed.splitlines() if line.startswith("step 4/6 train")]
    assert lines, printed
    for rate in ("steps_per_s=", "samples_per_s=", "flops_per_s="):
        assert rate in lines[0], lines[0]
    assert summary["time_to_first_step_s"] >= summary["first_step_compile_s"] > 0
    throughput = summary["throughput"]
    assert throughput["flops_per_step"] > 0 and "mfu" not in throughput  # XLA:CPU: no peak
    assert throughput["samples_per_s"] == pytest.approx(
        throughput["steps_per_s"] * summary["global_batch"]
    )
{%- if cookiecutter.example_task in ("lm", "hf-causal-lm") %}
    assert "tokens_per_s=" in lines[0]
    seq_len = TINY["task_options"]["seq_len"]
    assert throughput["tokens_per_s"] == pytest.approx(throughput["samples_per_s"] * seq_len)
{%- endif %}


def test_a_run_says_its_steps_and_after_warm_up_the_time_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It prints the steps it will train, then `step N/TOTAL` on every logged step, with the
    time left once the first step (its compilation) is behind it."""
    options = {**TINY, "accelerator": "cpu", "max_steps": 6, "log_every": 1, "eval_every": 0}
    fit(TrainConfig(**options, run_dir=str(tmp_path)), make_plan("cpu", 1, "single"))
    printed = capsys.readouterr().out.splitlines()

    assert "steps: 6 (max_steps)" in printed, printed
    logged = [line for line in printed if re.match(r"step \d+/6 train loss=", line)]
    assert [line.split()[1] for line in logged] == [f"{n}/6" for n in range(1, 7)], printed
    assert not re.search(r" left \S+$", logged[0])  # the first step compiles: no pace yet
    for line in logged[1:]:
        assert re.search(r" left (\d+h\d\dm|\d+m\d\ds|\d+s)$", line), line
    assert logged[-1].endswith(" left 0s")
