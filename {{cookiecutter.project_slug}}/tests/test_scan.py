"""scan_layers: the blocks run through XLA's scan, train like the unrolled model, and
checkpoints move between the two."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any
{%- if cookiecutter.example_task == "lm" %}

import pytest

from {{ cookiecutter.package_name }}.core import make_plan
from {{ cookiecutter.package_name }}.training import TrainConfig, fit

from training_helpers import TINY, cli, write_config

PLAN = make_plan("cpu", 1, "single")
{%- else %}

from training_helpers import cli, write_config
{%- endif %}


def train_scanned(tmp_path: Path, *flags: str, **options: Any) -> subprocess.CompletedProcess[str]:
    """The CLI's `train` on 2 steps with scan_layers (and `options`), given `flags`."""
    config = write_config(tmp_path, scan_layers=True, max_steps=2, **options)
    return cli("train", "--config", str(config), *flags, "--run-dir", str(tmp_path / "run"))
{%- if cookiecutter.example_task == "lm" %}


DEEP = {**TINY, "task_options": {**TINY["task_options"], "layers": 4}}
# Scanning changes how XLA fuses the blocks, so bf16 roundings land in other places.
{%- if cookiecutter.precision == "32-true" %}
LOSS_REL = 1e-5
{%- else %}
LOSS_REL = 1e-3
{%- endif %}


def run(tmp_path: Path, name: str, **overrides: Any) -> dict[str, Any]:
    config = TrainConfig(
        **{**DEEP, "accelerator": "cpu", "log_every": 1, "run_dir": str(tmp_path / name)},
        **overrides,
    )
    return fit(config, PLAN)


def test_scanned_blocks_give_the_unrolled_losses_with_one_graph(tmp_path: Path) -> None:
    """It trains 4 scanned blocks to the unrolled model's losses, one train graph each."""
    unrolled = run(tmp_path, "unrolled", max_steps=6)
    scanned = run(tmp_path, "scanned", max_steps=6, scan_layers=True)

    assert scanned["loop_compilations"] == unrolled["loop_compilations"] == 1
    for (step, loss), (_, reference) in zip(
        scanned["train_losses"], unrolled["train_losses"], strict=True
    ):
        assert loss == pytest.approx(reference, rel=LOSS_REL), step
    # The parameters keep the unrolled model's names: the tie report and memory agree.
    assert scanned["tied_parameters"]["groups"] == unrolled["tied_parameters"]["groups"]
    assert scanned["memory"]["param_bytes_total"] == unrolled["memory"]["param_bytes_total"]


def test_scanned_checkpoint_resumes_unrolled(tmp_path: Path) -> None:
    """It continues a scanned run's checkpoint unrolled, with the uninterrupted losses."""
    straight = run(tmp_path, "straight", max_steps=8)
    run(tmp_path, "both", max_steps=4, scan_layers=True)
    resumed = run(tmp_path, "both", max_steps=8, resume="latest")

    assert [s for s, _ in resumed["train_losses"]] == list(range(1, 9))
    for (step, loss), (_, reference) in zip(
        resumed["train_losses"], straight["train_losses"], strict=True
    ):
        assert loss == pytest.approx(reference, rel=LOSS_REL), step


def test_scan_refuses_dropout_with_one_line(tmp_path: Path) -> None:
    """It names the dropout that torch_xla's scan cannot carry, before anything runs."""
    options = {**DEEP["task_options"], "dropout": 0.1}
    # One device, whatever the baked project's default strategy (fsdp refuses scan first).
    result = train_scanned(tmp_path, "--strategy", "single", task_options=options)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "dropout" in lines[0] and "scan_layers" in lines[0], lines
{%- else %}


def test_scan_needs_a_block_stack(tmp_path: Path) -> None:
    """It refuses scan_layers for a model without a BlockStack, in one line."""
    result = train_scanned(tmp_path, "--strategy", "single")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "BlockStack" in lines[0], lines
{%- endif %}


def test_scan_under_fsdp_is_refused_before_launch(tmp_path: Path) -> None:
    """It refuses scan_layers under fsdp with one line, without starting SPMD."""
    result = train_scanned(tmp_path, "--devices", "8", "--strategy", "fsdp")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: scan_layers does not run under fsdp with torch_xla 2.9 (its scan cannot trace "
        "FSDPv2-wrapped blocks): use --strategy single or spmd, or scan_layers = false"
    ]
