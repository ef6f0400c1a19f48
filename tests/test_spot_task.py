"""SkyPilot's own parser reads a bake's spot tasks: one host, a v5p-64 pod, zones to fail over to.

SkyPilot 0.14.1 lives in an environment of its own, `.venv-sky` (requirements-sky.txt; the
Makefile's `test` sets it up): its click pin clashes with the Hugging Face libraries of
requirements-dev.txt. Without it the test skips, unless TPU_TEMPLATE_REQUIRE_SKYPILOT=1 (CI).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from helpers import TEMPLATE_DIR, Baked, tool_env

SKY_PYTHON = Path(os.environ.get("TPU_TEMPLATE_SKY_PYTHON", TEMPLATE_DIR / ".venv-sky/bin/python"))
BUCKET = "gs://bucket/runs/week"
SHAPES = {
    "one host": (),
    "v5p-64 pod": ("ACCELERATOR_TYPE=v5p-64", "RUNTIME_VERSION=v2-alpha-tpuv5"),
    "zones to fail over to": ("ZONES=us-west4-a us-central1-a europe-west4",),
}
# Run by SkyPilot's interpreter: each task as sky.Task.from_yaml reads it, as JSON.
PARSE = """
import json, sys
import sky

parsed = []
for path in sys.argv[1:]:
    task = sky.Task.from_yaml(path)
    parsed.append({
        "run": task.run, "setup": task.setup, "nodes": task.num_nodes,
        "mounts": task.file_mounts,
        "resources": sorted(
            ({"accelerators": r.accelerators, "args": r.accelerator_args, "spot": r.use_spot,
              "cloud": str(r.cloud), "region": r.region, "zone": r.zone,
              "recovery": r.job_recovery} for r in task.resources),
            key=lambda r: (r["region"] or "", r["zone"] or ""),
        ),
    })
print(json.dumps(parsed))
"""


def sky_python() -> Path:
    if not SKY_PYTHON.is_file():
        reason = f"no SkyPilot client at {SKY_PYTHON}: make venv installs it (requirements-sky.txt)"
        if os.environ.get("TPU_TEMPLATE_REQUIRE_SKYPILOT") == "1":
            pytest.fail(f"{reason} (required by TPU_TEMPLATE_REQUIRE_SKYPILOT=1)", pytrace=False)
        pytest.skip(reason)
    return SKY_PYTHON


def test_skypilot_parses_the_spot_task_of_one_host_a_pod_and_a_zone_list(
    bake_combo: Callable[[str], Baked], tmp_path: Path
) -> None:
    """It gets from SkyPilot's own parser, offline, the TPU, spot, zones, recovery, files,
    setup and per-host command each `make spot-task` wrote."""
    python = sky_python()
    baked = bake_combo("default-lm")
    env = tool_env(PYTHONPATH=str(baked.path / "src"))
    written = []
    for index, variables in enumerate(SHAPES.values()):
        out = tmp_path / f"task-{index}.yaml"
        made = subprocess.run(
            ["make", "-s", "spot-task", f"VENV={sys.prefix}", f"SPOT_TASK={out}",
             f"CHECKPOINT_DIR={BUCKET}", *variables],
            cwd=baked.path, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        written.append(yaml.safe_load(out.read_text()))
    # From the project: the tasks' file mounts are relative to where they are launched.
    parsed = subprocess.run(
        [str(python), "-c", PARSE, *(str(tmp_path / f"task-{i}.yaml") for i in range(3))],
        cwd=baked.path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert parsed.returncode == 0, parsed.stderr[-3000:]
    one_host, pod, zones = json.loads(parsed.stdout.strip().splitlines()[-1])

    recovery = {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 3,
                "recover_on_exit_codes": [75]}  # fmt: skip
    for task, source in zip((one_host, pod, zones), written, strict=True):
        assert (task["run"], task["setup"], task["nodes"]) == (source["run"], source["setup"], 1)
        assert task["mounts"] == source["file_mounts"]
        assert all(r["spot"] and r["recovery"] == recovery for r in task["resources"])
        assert all(r["cloud"] == "GCP" for r in task["resources"])
    assert [r["accelerators"] for r in one_host["resources"]] == [{"tpu-v5litepod-8": 1}]
    assert [(r["region"], r["zone"]) for r in one_host["resources"]] == [("us-west4", "us-west4-a")]
    (pod_slice,) = pod["resources"]
    assert pod_slice["accelerators"] == {"tpu-v5p-64": 1}
    assert pod_slice["args"] == {"runtime_version": "v2-alpha-tpuv5", "tpu_vm": True}
    assert [(r["region"], r["zone"]) for r in zones["resources"]] == [
        ("europe-west4", None), ("us-central1", "us-central1-a"), ("us-west4", "us-west4-a"),
    ]  # fmt: skip
