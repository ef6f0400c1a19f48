"""What a run holds on each XLA device, read from XLA's own buffer assignment of every
program it compiles: no program of a replayed fsdp run needs more than `plan` says. torch_xla
only: torch_tpu compiles with dynamo, whose programs XLA does not lay out."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from {{ cookiecutter.package_name }}.core import runtime

from backend_facts import MANY_DEVICES, many
from training_helpers import TINY, cli, cli_json, write_config


def per_program_bytes(dump: Path) -> dict[str, int]:
    """Each dumped program's "Total bytes used" per device, by program name."""
    found = {path.name: re.search(r"Total bytes used: (\d+)", path.read_text())
             for path in dump.glob("*buffer-assignment.txt")}  # fmt: skip
    return {name.split(".cpu_after")[0]: int(match[1]) for name, match in found.items() if match}


def test_no_program_of_a_replayed_fsdp_run_needs_more_per_device_than_plan_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It holds the state its step updates once on each device, and gathers each block's
    weights when the block runs: no program the run compiles needs more bytes than `plan`'s
    total. The model's weights outweigh its activations (8 blocks of width 256, one sample
    of 8 tokens per device), so a step that kept the old state beside the new would not
    fit{% if cookiecutter.example_task == "hf-causal-lm" %}; nor would XLA:CPU's default schedule, which starts every block's
    gather before the first block runs (28.9 MB against 27.1 MB planned; 25.6 MB with the
    schedule the project asks for){% endif %}."""
    options = {**TINY["task_options"], "seq_len": 8, "dim": 256, "layers": 8, "heads": 4}
    config = write_config(
        tmp_path, max_steps=3, batch_size=1, eval_batch_size=1, task_options=options
    )
    dump = tmp_path / "xla"
    monkeypatch.setenv("XLA_FLAGS", f"--xla_dump_to={dump}")
    done = cli("train", "--config", str(config), "--run-dir", str(tmp_path / "run"), *many("fsdp"))
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["step"]["replayed"] is True
    monkeypatch.delenv("XLA_FLAGS")
    planned = cli_json("plan", "--config", str(config), "--mesh", f"fsdp={MANY_DEVICES}")
    total = json.loads(planned)["per_device"]["total_bytes"]
    used = per_program_bytes(dump)
    assert len(used) >= 2, sorted(used)  # the priming step and the replayed one, at least
    assert max(used.values()) <= total, (used, total)


@pytest.mark.parametrize(
    ("given", "passed"),
    [
        ("", f"--{runtime.CPU_SCHEDULE_FLAG}=false"),
        ("--xla_dump_to=/d", f"--xla_dump_to=/d --{runtime.CPU_SCHEDULE_FLAG}=false"),
        (f"--{runtime.CPU_SCHEDULE_FLAG}=true", f"--{runtime.CPU_SCHEDULE_FLAG}=true"),
    ],
)
def test_xla_cpu_schedules_each_gather_where_its_layer_runs_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch, given: str, passed: str
) -> None:
    """It asks XLA:CPU for the schedule that gathers a layer's weights where the layer runs
    (its default starts every gather up front), keeping the user's XLA_FLAGS, and the user's
    own choice of that scheduler."""
    for name in ("PJRT_DEVICE", "CPU_NUM_DEVICES"):
        monkeypatch.delenv(name, raising=False)  # configure sets them: undone after the test
    monkeypatch.setenv("XLA_FLAGS", given)
    runtime.configure("cpu", cpu_devices=MANY_DEVICES)
    assert os.environ["XLA_FLAGS"] == passed
