"""Every layout trains the one-process run: single = ddp x2 = fsdp x4 = fsdp x tensor 2x2.

Each run is real processes on the CPU (gloo), started by torchrun's launcher, the step
compiled by torch.compile; the global batch is the same in every layout (8 samples), so
each step's loss (the global batch's, averaged over the processes that read other data)
must be the one process's. The step guard is armed after the first steps: a graph compiled
after them fails the run. ddp x2 runs as two hosts of one process each (127.0.0.2 and .3,
met by torchrun's rendezvous as on a pod); the fsdp x4 run saves checkpoints on a GCS
emulator, from which a run on another disk resumes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gcs_emulator import GcsEmulator
from gcs_emulator import _bucket as emulator_bucket  # the bucket, for the whole module
from training_helpers import QUIET, TINY, cli_env, write_config

pytestmark = pytest.mark.slow  # several multi-process runs: `make test-fast` skips them

STEPS = 20
WARM_UP = 3  # steps after which no graph may compile
CHECKPOINT_EVERY = 10
# The torch_xla backend's tolerance for its sharded runs against one device.
TOLERANCE = 2e-3
LAYOUTS = {
    "single": {"devices": "1", "strategy": "single", "batch_size": 8},
    "fsdp-x4": {"devices": "4", "strategy": "fsdp", "batch_size": 2,
                "checkpoint_every": CHECKPOINT_EVERY, "keep_checkpoints": 3,
                "async_checkpoint": True},
    "fsdp-x-tensor-2x2": {"devices": "4", "strategy": "fsdp", "mesh": "fsdp=2,tensor=2",
                          "batch_size": 4},
}  # fmt: skip
TWO_HOSTS = "ddp-x2-two-hosts"

RUN = """
import json, sys
from {{ cookiecutter.package_name }}.core import launch
from {{ cookiecutter.package_name }}.training import build_config, fit, plan_of
config = build_config(None, json.loads(sys.argv[1]))
plan = plan_of(config)
summary = launch(fit, plan, args=(config, plan, None, None, int(sys.argv[2])))
print(json.dumps(summary))
"""


@pytest.fixture(scope="module")
def bucket(gcs_emulator: GcsEmulator) -> Iterator[str]:
    """An empty bucket on the GCS emulator, for the module's runs."""
    with pytest.MonkeyPatch.context() as patch:
        yield from emulator_bucket(gcs_emulator, patch)


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def two_hosts(folder: Path) -> dict[str, Any]:
    """The summary of a ddp run of two hosts (one process each) started as on a pod: each
    host's `train` from the slice's worker addresses and its own worker id."""
    config = write_config(folder, max_steps=STEPS, log_every=1, eval_every=0, batch_size=4)
    port = str(free_port())
    hosts = []
    for worker in range(2):
        env = {**cli_env(), "TPU_WORKER_HOSTNAMES": "127.0.0.2,127.0.0.3",
               "TPU_WORKER_ID": str(worker), "MASTER_PORT": port}  # fmt: skip
        command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "train",
                   "--config", str(config), "--devices", "1", "--strategy", "ddp",
                   "--run-dir", str(folder / f"host{worker}")]  # fmt: skip
        hosts.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))  # fmt: skip
    outputs = [host.communicate(timeout=900)[0] for host in hosts]
    assert [host.returncode for host in hosts] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert not (folder / "host1" / "summary.json").exists()  # the job's first process writes it
    return dict(json.loads((folder / "host0" / "summary.json").read_text()))


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory, python_subprocess: Any, bucket: str
) -> dict[str, Any]:
    """The summary of each layout's run of STEPS steps."""
    found = {}
    for name, layout in LAYOUTS.items():
        run_dir = tmp_path_factory.mktemp(name)
        overrides = {**TINY, **QUIET, **layout, "max_steps": STEPS, "log_every": 1,
                     "eval_every": 0, "run_dir": str(run_dir)}  # fmt: skip
        if "checkpoint_every" in layout:
            overrides["checkpoint_dir"] = f"{bucket}/runs/{name}"
        found[name] = python_subprocess(["-c", RUN, json.dumps(overrides), str(WARM_UP)])
    found[TWO_HOSTS] = two_hosts(tmp_path_factory.mktemp(TWO_HOSTS))
    return found


def test_every_layout_trains_the_one_process_losses(runs: dict[str, Any]) -> None:
    """It gives the one-process losses, step by step, under ddp, fsdp and fsdp x tensor."""
    reference = runs["single"]["train_losses"]
    assert [step for step, _ in reference] == list(range(1, STEPS + 1))
    expected_layouts = {**LAYOUTS, TWO_HOSTS: {"devices": "2", "strategy": "ddp"}}
    for name, summary in runs.items():
        assert summary["strategy"] == expected_layouts[name]["strategy"], name
        assert summary["devices"] == int(expected_layouts[name]["devices"]), name
        assert summary["global_batch"] == 8
        for (step, loss), (_, expected) in zip(summary["train_losses"], reference, strict=True):
            assert loss == pytest.approx(expected, rel=TOLERANCE), (name, step)


def test_no_graph_compiles_after_warm_up(runs: dict[str, Any]) -> None:
    """It compiles a fixed number of graphs in the first steps and none after them."""
    for name, summary in runs.items():
        step = {"replayed": True, "traced_because": None, "warmup_reads": 0}
        assert summary["step"] == step, name
        assert summary["diagnosis"] == [], (name, summary["diagnosis"])
        # dynamo compiled the step (an eager step would count none), before the guard armed.
        assert summary["loop_compilations"] > 0, (name, summary["loop_compilations"])
        if name == TWO_HOSTS:
            continue  # started by the CLI, which arms no guard
        guard = summary["guard"]
        assert guard is not None and guard["armed_at_step"] == WARM_UP, name
        assert guard["compilations"] == 0, name


def test_ties_hold_through_sharding(runs: dict[str, Any]) -> None:
    """It keeps the tied embedding and head one parameter under every layout."""
    for name, summary in runs.items():
        ties = summary["tied_parameters"]
        assert ties["groups"] and ties["before"] == ties["after"], (name, ties)


def test_resumed_run_from_gcs_equals_the_uninterrupted_one(
    runs: dict[str, Any], bucket: str, tmp_path: Path, python_subprocess: Any
) -> None:
    """It continues the fsdp x4 run from gs:// on a machine without its disk, losses exact."""
    remote = f"{bucket}/runs/fsdp-x4"
    whole = runs["fsdp-x4"]
    assert whole["checkpoint"] == f"{remote}/{STEPS}"

    import gcsfs

    fs = gcsfs.GCSFileSystem()
    fs.rm(f"{remote.removeprefix('gs://')}/{STEPS}", recursive=True)  # it stopped mid-way
    overrides = {**TINY, **QUIET, **LAYOUTS["fsdp-x4"], "max_steps": STEPS, "log_every": 1,
                 "eval_every": 0, "checkpoint_dir": remote, "resume": "auto",
                 "run_dir": str(tmp_path / "second")}  # fmt: skip
    resumed = python_subprocess(["-c", RUN, json.dumps(overrides), "0"])
    assert resumed["steps"] == STEPS
    after = [item for item in whole["train_losses"] if item[0] > CHECKPOINT_EVERY]
    assert [item for item in resumed["train_losses"] if item[0] > CHECKPOINT_EVERY] == after
{%- if cookiecutter.example_task == "hf-causal-lm" %}


# ---- LoRA (peft): bf16-mixed, the frozen base in bf16 --------------------------------------
LORA = {"lora": {"rank": 4, "alpha": 8, "base_bf16": True}, "precision": "bf16-mixed"}
LORA_LAYOUTS = {
    "single": LAYOUTS["single"],
    "fsdp-x2": {"devices": "2", "strategy": "fsdp", "batch_size": 4},
    # The adapters of a tensor-parallel layer split to match it (B column-wise, A row-wise).
    "fsdp-x-tensor-2x2": LAYOUTS["fsdp-x-tensor-2x2"],
}


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory: pytest.TempPathFactory, python_subprocess: Any) -> dict[str, Any]:
    """The summary of a LoRA run of STEPS steps on one process, under FSDP2 x2 and under
    fsdp x tensor 2x2."""
    found = {}
    for name, layout in LORA_LAYOUTS.items():
        run_dir = tmp_path_factory.mktemp(f"lora-{name}")
        overrides = {**TINY, **QUIET, **LORA, **layout, "max_steps": STEPS, "log_every": 1,
                     "eval_every": 0, "run_dir": str(run_dir)}  # fmt: skip
        found[name] = python_subprocess(["-c", RUN, json.dumps(overrides), str(WARM_UP)])
    return found


def test_lora_in_bf16_trains_only_the_adapters_alike_on_one_process_and_fsdp(
    lora_runs: dict[str, Any],
) -> None:
    """It trains a few percent of the weights in bf16-mixed, the frozen base held in bf16, with
    the one-process losses under FSDP2 x2 and fsdp x tensor 2x2, and no graph compiled after
    warm-up."""
    single = lora_runs["single"]
    counts = single["parameters"]
    assert 0 < counts["trainable"] < counts["total"] / 5
    frozen = counts["total"] - counts["trainable"]
    for name, summary in lora_runs.items():
        assert summary["parameters"] == counts, name
        assert summary["precision"] == "bf16-mixed", name
        assert summary["memory"]["param_bytes_total"] == 2 * frozen + 4 * counts["trainable"]
        assert summary["guard"]["compilations"] == 0 and summary["diagnosis"] == [], name
        losses = zip(summary["train_losses"], single["train_losses"], strict=True)
        for (step, loss), (_, expected) in losses:
            assert loss == pytest.approx(expected, rel=TOLERANCE), (name, step)


def test_lora_checkpoint_holds_only_the_adapters_and_their_optimizer_state(
    lora_runs: dict[str, Any],
) -> None:
    """It saves the adapters and their AdamW moments, not the frozen base (FSDP2's shards)."""
    from {{ cookiecutter.package_name }}.core.checkpointing import saved_keys

    from hf_helpers import assert_only_adapters_saved

    assert_only_adapters_saved(saved_keys(lora_runs["fsdp-x2"]["checkpoint"]))
{%- endif %}
