"""FSDP over several CPU devices trains like one device, on a share of the memory each."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from backend_facts import (
    MANY_DEVICES,
    REPLICATED,
    STEP_COUNTS_ON_DEVICE,
    many,
    one_graph_per_step_kind,
)
from gates import Gate
from training_helpers import cli, preempt_then_resume, write_config

pytestmark = pytest.mark.slow  # several end-to-end runs: `make test-fast` skips them

STEPS = 20
GLOBAL_BATCH = 32
FSDP = (*many("fsdp"), "--batch-size", str(GLOBAL_BATCH // MANY_DEVICES))
# Losses are sums over a different order of float additions on the shards: equal to
# rounding, far inside the 2e-3 the project promises.
TOLERANCE = 2e-3


def train(folder: Path, *args: str, **overrides: Any) -> dict[str, Any]:
    """A tiny run logging every step's loss; its summary."""
    config = write_config(folder, max_steps=STEPS, log_every=1, seed=3, **overrides)
    run_dir = folder / "run"
    result = cli("train", "--config", str(config), "--run-dir", str(run_dir), *args)
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(json.loads((run_dir / "summary.json").read_text()))


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return train(tmp_path_factory.mktemp("fsdp"), *FSDP)


def test_fsdp_losses_match_one_device(fsdp_run: dict[str, Any], tmp_path: Path) -> None:
    """It gives every step the loss of one device with the same global batch."""
    single = train(tmp_path, "--devices", "1", "--batch-size", str(GLOBAL_BATCH))

    assert fsdp_run["strategy"] == "fsdp" and fsdp_run["devices"] == MANY_DEVICES
    assert fsdp_run["global_batch"] == single["global_batch"] == GLOBAL_BATCH
    steps = [step for step, _ in single["train_losses"]]
    assert [step for step, _ in fsdp_run["train_losses"]] == steps == list(range(1, STEPS + 1))
    for (_, sharded), (step, reference) in zip(
        fsdp_run["train_losses"], single["train_losses"], strict=True
    ):
        assert sharded == pytest.approx(reference, rel=TOLERANCE), step


@one_graph_per_step_kind
def test_fsdp_compiles_one_train_graph(fsdp_run: dict[str, Any]) -> None:
    """It compiles one graph for the training step of the whole run."""
    assert fsdp_run["loop_compilations"] == 1


def test_fsdp_holds_a_share_of_the_state_per_device(
    fsdp_run: dict[str, Any], tmp_path: Path
) -> None:
    """It keeps parameters and AdamW state sharded: about 1/N per device of what the
    replicated strategy (spmd, ddp) keeps on N devices."""
    copies = train(tmp_path, *many(REPLICATED), "--max-steps", "1")
    sharded, replicated = fsdp_run["memory"], copies["memory"]

    assert replicated["state_bytes_per_device"] == replicated["state_bytes_total"]
    assert sharded["state_bytes_total"] == replicated["state_bytes_total"]
    # A share of the replicated state, plus the padding of shards of odd sizes.
    share = replicated["state_bytes_per_device"] / MANY_DEVICES
    assert share <= sharded["state_bytes_per_device"] < 1.3 * share, (sharded, replicated)
    # AdamW's two moments, and its step count where the backend keeps it on the device
    # (capturable): 4 bytes a tensor.
    counters = 4 * fsdp_run["tied_parameters"]["after"] if STEP_COUNTS_ON_DEVICE else 0
    assert sharded["optimizer_bytes_total"] == 2 * sharded["param_bytes_total"] + counters


def test_fsdp_keeps_tied_weights_one_parameter(fsdp_run: dict[str, Any]) -> None:
    """It reports the tied groups it re-tied, with the same count before and after."""
    ties = fsdp_run["tied_parameters"]
    assert ties["before"] == ties["after"]
{%- if cookiecutter.example_task == "lm" %}
    assert ties["groups"] == [["embed.weight", "head.weight"]]
{%- elif cookiecutter.example_task == "hf-causal-lm" %}
    assert ties["groups"] == [["model.embed_tokens.weight", "lm_head.weight"]]
{%- endif %}


@pytest.mark.interrupts
def test_fsdp_sigterm_then_resume_matches_the_uninterrupted_run(
    fsdp_run: dict[str, Any], gated_src: Path, tmp_path: Path
) -> None:
    """It stops on SIGTERM, and the resumed losses equal the uninterrupted run's exactly."""
    gate = Gate(tmp_path / "gate", steps=8)  # SIGTERM after step 8
    config = write_config(tmp_path, gate=gate, max_steps=STEPS, log_every=1, seed=3)
    run_dir = tmp_path / "run"
    args = ("train", "--config", str(config), "--run-dir", str(run_dir), *FSDP)
    summary = preempt_then_resume(args, run_dir, gate, gated_src)
    assert summary["train_losses"] == fsdp_run["train_losses"]


def guarded_fit(precision: str, grad_accum: int) -> dict[str, Any]:
    """Fit under fsdp with the step guard armed after warm-up (child process)."""
    import tempfile

    from {{ cookiecutter.package_name }}.core import launch
    from {{ cookiecutter.package_name }}.training import build_config, fit, plan_of

    from training_helpers import TINY

    with tempfile.TemporaryDirectory() as run_dir:
        settings = {**TINY, "accelerator": "cpu", "devices": str(MANY_DEVICES), "strategy": "fsdp"}
        config = build_config(
            None,
            {**settings, "precision": precision, "grad_accum": grad_accum, "max_steps": 12,
             "eval_every": 4, "log_every": 2, "batch_size": 16 // MANY_DEVICES,
             "run_dir": run_dir},
        )  # fmt: skip
        plan = plan_of(config)
        return dict(launch(fit, plan, (config, plan, None, None, 4)))


@pytest.fixture(
    scope="module", params=[("bf16-mixed", 1), ("32-true", 2)], ids=["bf16-mixed", "accum-2"]
)
def guarded_run(request: pytest.FixtureRequest, python_subprocess: Any) -> dict[str, Any]:
    """A guarded fsdp fit in bf16-mixed, and one accumulating 2 micro-batches: its summary."""
    precision, grad_accum = request.param
    summary = dict(python_subprocess([__file__, precision, str(grad_accum)], env={}))
    assert summary["precision"] == precision
    return summary


def test_fsdp_compiles_nothing_after_warm_up(guarded_run: dict[str, Any]) -> None:
    """It runs bf16-mixed and gradient accumulation under fsdp with no graph after warm-up."""
    guard = guarded_run["guard"]
    assert guard is not None and guard["compilations"] == 0, guard
    assert guarded_run["fallback_ops"] == {}


@one_graph_per_step_kind
def test_fsdp_compiles_one_graph_per_step_kind(guarded_run: dict[str, Any]) -> None:
    """It compiles one train step graph and one eval step graph, in either mode."""
    assert guarded_run["loop_compilations"] == 2


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    print(json.dumps(guarded_fit(sys.argv[1], int(sys.argv[2]))))
