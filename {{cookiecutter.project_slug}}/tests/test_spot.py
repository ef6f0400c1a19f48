"""The SkyPilot task of a spot run: what it asks for, its per-host command, its refusals."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from {{ cookiecutter.package_name }}.cli_common import EXIT_PREEMPTED

PROJECT = Path(__file__).resolve().parents[1]
SLUG = "{{ cookiecutter.project_slug }}"
BUCKET = "gs://bucket/runs/exp1"
V5P_64 = ("ACCELERATOR_TYPE=v5p-64", "RUNTIME_VERSION=v2-alpha-tpuv5")


def make(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`make ARGS` in the project, its CLI run by this interpreter from src/; of the settings
    the launchers forward to workers (XLA_*, TPU_*, ...), only those in `env`."""
    forwarded = ("XLA_", "PJRT_", "TPU_", "LIBTPU_")
    variables = {k: v for k, v in os.environ.items() if not k.startswith(forwarded)}
    variables.update({"PYTHONPATH": str(PROJECT / "src"), **env})
    for name in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL"):
        variables.pop(name, None)
    command = ["make", "-s", "--no-print-directory", f"VENV={sys.prefix}", *args]
    return subprocess.run(
        command, cwd=PROJECT, env=variables, capture_output=True, text=True, timeout=120
    )


def spot_task(tmp_path: Path, *variables: str, **env: str) -> dict[str, Any]:
    """The task `make spot-task` writes, as YAML reads it."""
    out = tmp_path / "task.yaml"
    done = make("spot-task", f"SPOT_TASK={out}", f"CHECKPOINT_DIR={BUCKET}", *variables, **env)
    assert done.returncode == 0, done.stderr
    return dict(yaml.safe_load(out.read_text()))


def train_pod_commands(*variables: str, **env: str) -> list[str]:
    """What `make train-pod` sends each worker over ssh (its dry run)."""
    done = make("train-pod", "DRY_RUN=1", *variables, **env)
    assert done.returncode == 0, done.stderr
    commands = [shlex.split(line) for line in done.stdout.splitlines() if "tpu-vm ssh" in line]
    return [argv[argv.index("--command") + 1] for argv in commands]


def test_every_host_runs_the_line_train_pod_sends_each_worker(tmp_path: Path) -> None:
    """It runs on every host of a v5p-64 exactly, character for character, the command
    `make train-pod` sends each of its 8 workers, local XLA settings forwarded alike."""
    args = "ARGS=--max-steps 5 --config configs/{{ cookiecutter.example_task }}.toml"
    settings = {"XLA_FLAGS": "--xla_dump_to=/tmp/dump", "LIBTPU_INIT_ARGS": "--xla_tpu_x=1"}
    task = spot_task(tmp_path, *V5P_64, args, **settings)
    sent = train_pod_commands(*V5P_64, f"{args} --checkpoint-dir {BUCKET}", **settings)
    assert len(sent) == 8
    assert sent == [task["run"]] * 8
    assert task["run"].startswith(
        f"export LIBTPU_INIT_ARGS=--xla_tpu_x=1 XLA_FLAGS=--xla_dump_to=/tmp/dump "
        f"PJRT_DEVICE=TPU && cd {SLUG} && PYTHONPATH=src /opt/{SLUG}/.venv/bin/python "
        "-m {{ cookiecutter.package_name }} train --accelerator tpu --devices all --resume auto"
    )


def test_task_asks_for_the_spot_slice_its_zones_and_bounded_retries(tmp_path: Path) -> None:
    """It asks for a spot v5p-64 TPU VM in a failover list of zones and regions, relaunches it
    after preemptions (exit 75 included) and at most 2 times after errors, mounts what
    `pod sync` copies, and sets it up with the TPU startup script and the project."""
    task = spot_task(tmp_path, *V5P_64, "ZONES=us-east5-a us-central1", "MAX_RESTARTS_ON_ERRORS=2")
    resources = task["resources"]
    assert resources["accelerators"] == "tpu-v5p-64"
    assert resources["accelerator_args"] == {"runtime_version": "v2-alpha-tpuv5", "tpu_vm": True}
    assert resources["use_spot"] is True
    assert resources["any_of"] == [
        {"infra": "gcp/us-east5/us-east5-a"},
        {"infra": "gcp/us-central1"},
    ]
    assert resources["job_recovery"] == {
        "strategy": "EAGER_NEXT_REGION",
        "max_restarts_on_errors": 2,
        "recover_on_exit_codes": [EXIT_PREEMPTED],
    }
    assert task["file_mounts"] == {
        f"{SLUG}/{name}": name
        for name in ("pyproject.toml", "README.md", "Makefile", "src", "configs", "scripts")
    }
    startup, install = task["setup"].splitlines()
    assert startup == f"sudo env LOG=/dev/stdout bash {SLUG}/scripts/tpu-startup.sh"
    assert install.startswith(f"cd {SLUG} && if [ -w /opt/{SLUG}/.venv/bin ]; then ")
    assert "-m pip install --quiet '.[gcs,goodput]'" in install


def test_task_defaults_to_the_projects_tpu_in_its_zone_and_on_demand_when_asked(
    tmp_path: Path,
) -> None:
    """It describes the project's own TPU in its baked zone, on demand with ON_DEMAND=1."""
    task = spot_task(tmp_path, "ON_DEMAND=1")
    resources = task["resources"]
    assert resources["accelerators"] == "tpu-{{ cookiecutter.accelerator_type }}"
    assert resources["infra"] == "gcp/{{ cookiecutter.zone.rsplit('-', 1)[0] }}/{{ cookiecutter.zone }}"
    assert resources["use_spot"] is False and "any_of" not in resources


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (
            ("CHECKPOINT_DIR=runs/exp1",),
            "a spot run keeps its checkpoints on gs://, got 'runs/exp1'",
        ),
        (("CHECKPOINT_DIR=",), "a spot run keeps its checkpoints on gs://, got none"),
        (("ACCELERATOR_TYPE=v7x-8",), "unknown accelerator type 'v7x-8'"),
        (("ACCELERATOR_TYPE=v5p-12",), "accelerator type 'v5p-12' is not a v5p slice"),
        (
            ("ACCELERATOR_TYPE=v5p-64", "RUNTIME_VERSION=v2-alpha-tpuv5-lite"),
            "runtime 'v2-alpha-tpuv5-lite' is v5litepod's, not v5p's",
        ),
        (("SLICES=2",), "SLICES=2: SkyPilot 0.14 creates each TPU slice as a TPU VM of its own"),
        (("ZONES=moon-base",), "'moon-base' is neither a zone (us-east5-a) nor a region"),
        (("ARGS=--checkpoint-dir gs://b/x",), "give the checkpoint directory once"),
    ],
)
def test_bad_spot_request_is_refused_in_one_line_before_anything_is_launched(
    tmp_path: Path, variables: tuple[str, ...], message: str
) -> None:
    """It refuses with one `error:` line, writes no task and never calls SkyPilot's client."""
    called = tmp_path / "sky-was-called"
    sky = tmp_path / "sky"
    sky.write_text(f"#!/bin/sh\ntouch {called}\n")
    sky.chmod(0o755)
    out = tmp_path / "task.yaml"
    done = make(
        "train-spot", f"SKY={sky}", f"SPOT_TASK={out}", f"CHECKPOINT_DIR={BUCKET}", *variables
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], done.stderr
    assert not out.exists() and not called.exists()


def test_spot_targets_launch_follow_and_cancel_the_managed_job() -> None:
    """It installs SkyPilot's client apart, launches with `sky jobs launch` (detached), follows
    with `sky jobs queue` and `sky jobs logs`, and stops with `sky jobs cancel`."""
    sky = ".venv-sky/bin/sky"
    expected = {
        "sky-install": ".venv-sky/bin/python -m pip install --quiet 'skypilot[gcp]==0.14.1'",
        "train-spot": f"{sky} jobs launch --yes --detach-run --name {SLUG} .sky/{SLUG}.yaml",
        "spot-status": f"{sky} jobs queue",
        "spot-logs": f"{sky} jobs logs --name {SLUG}",
        "spot-cancel": f"{sky} jobs cancel --yes --name {SLUG}",
    }
    for target, command in expected.items():
        shown = make("-n", target, f"CHECKPOINT_DIR={BUCKET}")
        assert shown.returncode == 0, shown.stderr
        assert command in shown.stdout.splitlines(), shown.stdout
    logs = make("-n", "spot-logs", "CONTROLLER=1")
    assert f"{sky} jobs logs --name {SLUG} --controller" in logs.stdout.splitlines()
