"""Throughput a TPU user can read: steps, samples, tokens and model FLOPs per second, and MFU.

Model FLOPs per step are counted once, before training, by running the task's loss and
its backward pass on a copy of the model on PyTorch's meta device (no memory, no
compute) under `torch.utils.flop_counter`. A mixture of experts counts what its routed
tokens compute (each token through its top-k experts: the active parameters), not the
padding of the experts' capacity (`hf/experts.py`). MFU (model FLOPs utilisation) is

    FLOPs per step x steps per second / (chips x peak bf16 FLOPs per chip)

with the chip's peak from the TPU generations table; off-TPU there is no peak to
compare with, so only FLOPs/s is reported.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from .. import hf
from ..core import runtime
from ..tasks import Task
from ..weights.meta import parameters_on_meta


def count_flops(task: Task, sample: dict[str, torch.Tensor]) -> int | None:
    """Forward + backward FLOPs of the task's loss on one batch shaped like `sample`."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with torch.device("meta"), parameters_on_meta():  # from a config, never weights
            model = hf.prepare(task.build_model())  # the forward a run runs
        batch = {key: torch.empty_like(value, device="meta") for key, value in sample.items()}
        with FlopCounterMode(display=False) as counter:
            task.loss(model, batch).backward()
    except Exception:  # a model that cannot live on the meta device: FLOPs stay unknown
        return None
    return int(counter.get_total_flops())


@dataclass
class Peak:
    """The job's peak bf16 FLOPs/s on TPU: chips x the chip's peak (None off-TPU)."""

    accelerator_type: str
    chips: float
    flops_per_second: float

    @classmethod
    def of_job(cls, accelerator: str) -> Peak | None:
        if accelerator != "tpu":
            return None
        kind = runtime.accelerator_type()
        try:
            per_chip = runtime.peak_bf16_flops_per_chip(kind)
            chips = runtime.global_device_count() / runtime.devices_per_chip(kind)
        except runtime.RuntimeConfigError:  # a type the table does not know: no peak
            return None
        return cls(kind, chips, chips * per_chip)


class Meter:
    """Rates between logging steps, from the host clock when each step's loss is read."""

    def __init__(
        self,
        samples_per_step: int,
        tokens_per_sample: int | None,
        flops_per_step: int | None,
        peak: Peak | None,
    ) -> None:
        self.samples_per_step = samples_per_step
        self.tokens_per_sample = tokens_per_sample
        self.flops_per_step = flops_per_step
        self.peak = peak
        self.mark: tuple[int, float] | None = None

    def start(self, step: int) -> None:
        """Start the clock after a step has finished (after the first one: compile excluded)."""
        self.mark = (step, time.perf_counter())

    def rates(self, steps_per_second: float) -> dict[str, float]:
        """Every rate that follows from a step rate."""
        result = {
            "steps_per_s": steps_per_second,
            "samples_per_s": steps_per_second * self.samples_per_step,
        }
        if self.tokens_per_sample:
            result["tokens_per_s"] = result["samples_per_s"] * self.tokens_per_sample
        if self.flops_per_step:
            result["flops_per_s"] = steps_per_second * self.flops_per_step
            if self.peak is not None:
                result["mfu"] = result["flops_per_s"] / self.peak.flops_per_second
        return result

    def tick(self, step: int) -> dict[str, float]:
        """Rates since the previous tick (empty before the clock started)."""
        now = time.perf_counter()
        if self.mark is None or step <= self.mark[0]:
            return {}
        rate = (step - self.mark[0]) / (now - self.mark[1])
        self.mark = (step, now)
        return self.rates(rate)

    def summary(self, steps_per_second: float) -> dict[str, Any]:
        """The run's throughput for summary.json."""
        result: dict[str, Any] = {
            **self.rates(steps_per_second),
            "flops_per_step": self.flops_per_step,
        }
        if self.peak is not None:
            result["peak_flops_per_s"] = self.peak.flops_per_second
            result["accelerator_type"] = self.peak.accelerator_type
        return result


def throughput_line(first: dict[str, float]) -> str:
    """The report of the first step: how long until it finished, how much was compiling."""
    return (
        f"first step: {first['time_to_first_step_s']:.1f} s, "
        f"of which compiling {first['first_step_compile_s']:.1f} s"
    )
