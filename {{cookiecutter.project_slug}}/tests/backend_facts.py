"""What the tests expect of this bake's backend ({{ cookiecutter.backend }}), in one place: the
shared tests read these (directly, in the fresh interpreters they start, or through the
`backend` fixture) instead of asking which backend runs."""

from __future__ import annotations
{% if cookiecutter.backend == "torch_tpu" %}
import pytest
{%- else %}
from typing import Any
{%- endif %}

NAME = "{{ cookiecutter.backend }}"
{%- if cookiecutter.backend == "torch_tpu" %}
# Off a TPU the same code runs on the CPU: one process per device, over gloo.
DEVICE_TYPE = "cpu"
CPU_KIND = "CPU"
# Several slices: no mesh over them (multislice is torch_xla's), v2 and v3 not run at all.
MESH_SPANS_SLICES = False
# What decides the accelerator before any detection (the one a run resolved to), and what
# the fresh interpreters of the tests set (nothing: off a TPU they find the CPU).
ACCELERATOR_SETTINGS = ("TORCH_TPU_PROJECT_ACCELERATOR",)
CHILD_ENV: dict[str, str] = {}
# A job of several devices: that many CPU processes, started by the project's own launcher
# (each starts an interpreter and compiles its step: two keep the tests quick).
MANY_DEVICES = 2
# The strategy that copies the model to every device, and the one that shards it.
REPLICATED = "ddp"
SHARDED = "fsdp"
# `make train-8 ACCELERATOR=cpu` starts 8 processes: its tests ask for 2 (`--devices 2`).
TRAIN_8_DEVICES = 2
STRATEGIES = ("single", "ddp", "fsdp")
# A plain `module.to(device)` keeps tied weights one parameter on the CPU.
PLAIN_TO_UNTIES = False
# A mixture's experts' capacity and its router's balancing loss count each process's own
# tokens: under fsdp its processes drop other tokens than one device does, and balance other
# loads (the loss of a mean is not the mean of the processes' losses).
MOE_OVER_THE_GLOBAL_BATCH = False
# AdamW counts its steps on the host (not capturable): its state on the device is its moments.
STEP_COUNTS_ON_DEVICE = False
# The compiled step draws dropout's random numbers as dynamo's graphs do, not as the eager
# step (`replay_step = false`) does: with dropout the two runs' losses differ.
COMPILED_DRAWS_AS_EAGER = False
# What the step guard calls a device read.
TRANSFER = "device-to-host read"
# Where `profile` writes its traces (below RUN_DIR/profile/plugins/profile), and a line of
# the metrics report `debug` saves.
TRACES = "*.pt.trace.json"
METRICS_REPORT = "compiled graphs: "
# What `doctor` says of the versions and of the device off a TPU.
DOCTOR_VERSIONS = ("torch 2.13", "torch-tpu not installed (not needed off a TPU")
DOCTOR_DEVICE = "CPU (no TPU on this host)"
{%- else %}
# XLA:CPU: one process, the devices emulated through SPMD.
DEVICE_TYPE = "xla"
CPU_KIND = "XLA:CPU"
# Several slices of a TPU: one mesh over them.
MESH_SPANS_SLICES = True
# What decides the accelerator before any detection (PJRT's device, libtpu's location), and
# what the fresh interpreters of the tests set: XLA:CPU, whatever the shell's PJRT_DEVICE says.
ACCELERATOR_SETTINGS = ("PJRT_DEVICE", "TPU_LIBRARY_PATH")
CHILD_ENV = {"PJRT_DEVICE": "CPU"}
# A job of several devices: 8 XLA:CPU devices in one process.
MANY_DEVICES = 8
# The strategy that copies the model to every device, and the one that shards it.
REPLICATED = "spmd"
SHARDED = "fsdp"
# `make train-8 ACCELERATOR=cpu` emulates 8 devices in one process, as its tests run it.
TRAIN_8_DEVICES = 8
STRATEGIES = ("single", "ddp", "spmd", "fsdp")
# A plain `module.to(device)` gives each tied use its own copy on the XLA device.
PLAIN_TO_UNTIES = True
# One program runs the global batch (SPMD): a mixture's experts' capacity and its router's
# balancing loss count all of its tokens.
MOE_OVER_THE_GLOBAL_BATCH = True
# AdamW counts its steps on the device (capturable): a 4-byte count per parameter tensor.
STEP_COUNTS_ON_DEVICE = True
# The replayed step draws from the device's seed as the traced step does.
COMPILED_DRAWS_AS_EAGER = True
# What the step guard calls a device read.
TRANSFER = "device-to-host transfer"
# Where `profile` writes its traces (below RUN_DIR/profile/plugins/profile), and a line of
# the metrics report `debug` saves.
TRACES = "*/*.xplane.pb"
METRICS_REPORT = "Metric: CompileTime"
# What `doctor` says of the versions and of the device off a TPU.
DOCTOR_VERSIONS = ("torch 2.9", "torch_xla 2.9", "(in lockstep)")
DOCTOR_DEVICE = "XLA:CPU (xla:0), 1 device"
{%- endif %}
{%- if cookiecutter.backend == "torch_tpu" %}


# How many graphs a run compiles is not one per step kind here: dynamo splits the step at
# backward() and in the optimizer, into more graphs under fsdp and gradient accumulation. The
# tests of that count are expected to fail (strict: one that passes says so); the guard's
# (no graph compiled after warm-up) hold.
ONE_GRAPH_PER_STEP_KIND = False
# On one device a training step is two graphs (the forward and loss; the optimizer's update),
# its backward run between them outside dynamo; an evaluation step is one.
TRAIN_GRAPHS_ONE_DEVICE = 2
one_graph_per_step_kind = pytest.mark.xfail(
    strict=True, reason="torch_tpu compiles several graphs for one step kind (dynamo's splits)"
)
{%- else %}


# A training step and an evaluation step compile one graph each, traced once and replayed:
# the tests of that count run as they are.
ONE_GRAPH_PER_STEP_KIND = True
TRAIN_GRAPHS_ONE_DEVICE = 1


def one_graph_per_step_kind(test: Any) -> Any:
    return test
{%- endif %}


def many(strategy: str = SHARDED) -> tuple[str, ...]:
    """The CLI's flags for a job of MANY_DEVICES devices under `strategy`."""
    return ("--devices", str(MANY_DEVICES), "--strategy", strategy)
