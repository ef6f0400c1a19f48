"""Every layout trains the one-process run: single = ddp x2 = fsdp x4 = fsdp x tensor 2x2.

Each run is real processes on the CPU (gloo), started by torchrun's launcher, the step
compiled by torch.compile; the global batch is the same in every layout (8 samples), so
each step's loss (the global batch's, averaged over the processes that read other data)
must be the one process's. The step guard is armed after the first steps: a graph compiled
after them fails the run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from training_helpers import QUIET, TINY

pytestmark = pytest.mark.slow  # several multi-process runs: `make test-fast` skips them

STEPS = 20
WARM_UP = 3  # steps after which no graph may compile
# The torch_xla backend's tolerance for its sharded runs against one device.
TOLERANCE = 2e-3
LAYOUTS = {
    "single": {"devices": "1", "strategy": "single", "batch_size": 8},
    "ddp-x2": {"devices": "2", "strategy": "ddp", "batch_size": 4},
    "fsdp-x4": {"devices": "4", "strategy": "fsdp", "batch_size": 2},
    "fsdp-x-tensor-2x2": {"devices": "4", "strategy": "fsdp", "mesh": "fsdp=2,tensor=2",
                          "batch_size": 4},
}  # fmt: skip

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
def runs(tmp_path_factory: pytest.TempPathFactory, python_subprocess: Any) -> dict[str, Any]:
    """The summary of each layout's run of STEPS steps."""
    found = {}
    for name, layout in LAYOUTS.items():
        run_dir = tmp_path_factory.mktemp(name)
        overrides = {**TINY, **QUIET, **layout, "max_steps": STEPS, "log_every": 1,
                     "eval_every": 0, "run_dir": str(run_dir)}  # fmt: skip
        found[name] = python_subprocess(["-c", RUN, json.dumps(overrides), str(WARM_UP)])
    return found


def test_every_layout_trains_the_one_process_losses(runs: dict[str, Any]) -> None:
    """It gives the one-process losses, step by step, under ddp, fsdp and fsdp x tensor."""
    reference = runs["single"]["train_losses"]
    assert [step for step, _ in reference] == list(range(1, STEPS + 1))
    for name, summary in runs.items():
        assert summary["strategy"] == LAYOUTS[name]["strategy"]
        assert summary["devices"] == int(LAYOUTS[name]["devices"])
        assert summary["global_batch"] == 8
        for (step, loss), (_, expected) in zip(summary["train_losses"], reference, strict=True):
            assert loss == pytest.approx(expected, rel=TOLERANCE), (name, step)


def test_no_graph_compiles_after_warm_up(runs: dict[str, Any]) -> None:
    """It compiles a fixed number of graphs in the first steps and none after them."""
    for name, summary in runs.items():
        guard = summary["guard"]
        assert guard is not None and guard["armed_at_step"] == WARM_UP, name
        assert guard["compilations"] == 0, name
        assert 1 <= summary["loop_compilations"] <= 12, (name, summary["loop_compilations"])
        assert summary["step"] == {"replayed": True, "traced_because": None}
        assert summary["diagnosis"] == [], (name, summary["diagnosis"])


def test_ties_hold_through_sharding(runs: dict[str, Any]) -> None:
    """It keeps the tied embedding and head one parameter under every layout."""
    for name, summary in runs.items():
        ties = summary["tied_parameters"]
        assert ties["groups"] and ties["before"] == ties["after"], (name, ties)


def test_resumed_run_from_gcs_equals_the_uninterrupted_one(
    gcs_bucket: str, tmp_path: Path, python_subprocess: Any
) -> None:
    """It continues an fsdp x2 run from gs:// on a machine without its disk, losses exact."""
    remote = f"{gcs_bucket}/runs/fsdp"
    layout = {"devices": "2", "strategy": "fsdp", "batch_size": 4, "max_steps": 8,
              "log_every": 1, "checkpoint_every": 4, "keep_checkpoints": 3,
              "checkpoint_dir": remote, "async_checkpoint": True}  # fmt: skip
    first = {**TINY, **QUIET, **layout, "run_dir": str(tmp_path / "first")}
    whole = python_subprocess(["-c", RUN, json.dumps(first), "0"])
    assert whole["checkpoint"] == f"{remote}/8"

    import gcsfs

    fs = gcsfs.GCSFileSystem()
    fs.rm(remote.removeprefix("gs://") + "/8", recursive=True)  # it stopped after step 4
    second = {**first, "run_dir": str(tmp_path / "second"), "resume": "auto"}
    resumed = python_subprocess(["-c", RUN, json.dumps(second), "0"])
    assert resumed["steps"] == 8
    assert resumed["train_losses"] == whole["train_losses"]


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_two_hosts_meet_and_train_the_one_process_losses(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    """It joins two hosts (127.0.0.2 and .3, one process each) into one job from the slice's
    worker addresses and ids, as on a pod, and trains the one-process losses."""
    import subprocess
    import sys

    from training_helpers import cli_env, write_config

    config = write_config(tmp_path, max_steps=STEPS, log_every=1, eval_every=0, batch_size=4)
    port = str(free_port())
    hosts = []
    for worker in range(2):
        env = {**cli_env(), "TPU_WORKER_HOSTNAMES": "127.0.0.2,127.0.0.3",
               "TPU_WORKER_ID": str(worker), "MASTER_PORT": port}  # fmt: skip
        run_dir = str(tmp_path / f"host{worker}")
        command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "train",
                   "--config", str(config), "--devices", "1", "--run-dir", run_dir]  # fmt: skip
        hosts.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))  # fmt: skip
    outputs = [host.communicate(timeout=900)[0] for host in hosts]
    assert [host.returncode for host in hosts] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    summary = json.loads((tmp_path / "host0" / "summary.json").read_text())
    assert not (tmp_path / "host1" / "summary.json").exists()  # the job's master writes it
    assert summary["strategy"] == "ddp" and summary["devices"] == 2
    assert summary["global_batch"] == 8
    reference = runs["single"]["train_losses"]
    for (step, loss), (_, expected) in zip(summary["train_losses"], reference, strict=True):
        assert loss == pytest.approx(expected, rel=TOLERANCE), step
