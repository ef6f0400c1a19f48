"""`batch_size` means one thing on every mesh: the samples of one device of the data axes."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # a fresh runtime per mesh: `make test-fast` skips them

BATCH_SIZE = 2
{%- if cookiecutter.backend == "torch_tpu" %}
DEVICES = 4
MESHES = ["fsdp=4", "fsdp=2,tensor=2", "data=2,fsdp=2"]
{%- else %}
DEVICES = 8
MESHES = ["fsdp=8", "fsdp=4,tensor=2", "context=4,fsdp=2", "data=2,fsdp=2,tensor=2"]
{%- endif %}
DATA_AXES = ("data", "fsdp", "expert")


def data_shards(mesh: str) -> int:
    sizes = dict(axis.split("=") for axis in mesh.split(","))
    return math.prod(int(size) for axis, size in sizes.items() if axis in DATA_AXES)


def batches(mesh: str) -> dict[str, Any]:
    """The rows one process is fed and the replicas reading other data, for training and
    evaluation, under `mesh` (child process: process 0's answer)."""
    from {{ cookiecutter.package_name }}.core import launch
    from {{ cookiecutter.package_name }}.training import build_config, plan_of

    from training_helpers import QUIET, TINY

    settings = {**TINY, **QUIET, "devices": str(DEVICES), "strategy": "fsdp", "mesh": mesh,
                "batch_size": BATCH_SIZE, "eval_batch_size": 0, "max_steps": 1}  # fmt: skip
    config = build_config(None, settings)
    plan = plan_of(config)
    return dict(launch(first_batches, plan, (config,)))


def first_batches(config: Any) -> dict[str, Any]:
    from {{ cookiecutter.package_name }}.core import Precision
    from {{ cookiecutter.package_name }}.tasks import load_task
    from {{ cookiecutter.package_name }}.training import plan_of
    from {{ cookiecutter.package_name }}.training.data import training_data
    from {{ cookiecutter.package_name }}.training.evaluation import Evaluator

    strategy = plan_of(config).strategy
    task = load_task(config.task, config.data, config.task_options)
    feeder, _ = training_data(task, strategy, config)
    first = next(iter(feeder.epoch(0)))
    evaluator = Evaluator(task, strategy, Precision.from_name("32-true"), config)
    eval_first = next(iter(evaluator.feeder.epoch(0)))
    return {
        "rows": int(next(iter(first.values())).shape[0]),
        "eval_rows": int(next(iter(eval_first.values())).shape[0]),
        "replicas": strategy.data_layout()[0],
        "eval_global_batch": evaluator.global_batch,
        "eval_samples": len(task.eval_dataset()),
    }


@pytest.mark.parametrize("mesh", MESHES)
def test_global_batch_is_batch_size_times_the_data_axes(mesh: str, python_subprocess: Any) -> None:
    """It feeds batch_size samples per device of the data axes (a tensor or context group
    shares them), in training and, by default, in evaluation."""
    fed = python_subprocess([__file__, mesh], env={})

    expected = BATCH_SIZE * data_shards(mesh)
    assert fed["rows"] * fed["replicas"] == expected, fed
    assert fed["eval_rows"] * fed["replicas"] == fed["eval_global_batch"] == expected, fed
    assert fed["eval_samples"] >= expected  # the split fills the batch: no cap applied


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    print(json.dumps(batches(sys.argv[1])))
