"""Sharding by rules: patterns to partition specs over data/fsdp/tensor axes, checked before
use, and (for the example) 2D meshes that train like one device on a fraction of the memory."""

from __future__ import annotations
{% if cookiecutter.example_task == "lm" %}
import json
from pathlib import Path
from typing import Any
{% endif %}
import pytest

from {{ cookiecutter.package_name }}.core import RuntimeConfigError
from {{ cookiecutter.package_name }}.core.sharding import (
    Rule,
    layout,
    over_slices,
    parse_mesh,
    parse_rules,
)
{%- if cookiecutter.example_task == "lm" %}

from training_helpers import cli, write_config
{%- endif %}

MESH = {"fsdp": 4, "tensor": 2}
PARAMS = {
    "qkv": ["blocks.0.attn.qkv.weight"],
    "norm": ["blocks.0.norm.weight"],
    "embed": ["embed.weight", "head.weight"],  # a tied pair: two names, one parameter
}
SHAPES = {"qkv": (96, 32), "norm": (32,), "embed": (256, 32)}


def test_mesh_takes_a_tensor_axis_innermost():
    """It orders data, fsdp, expert, tensor whatever order they are written in."""
    assert parse_mesh("tensor=2,data=2,fsdp=2") == (("data", 2), ("fsdp", 2), ("tensor", 2))
    assert parse_mesh("expert=4,fsdp=2") == (("fsdp", 2), ("expert", 4))


def test_rules_lay_out_what_they_name_and_fsdp_the_rest():
    """It takes the first rule naming a parameter (by any tied name), else the fsdp rule."""
    rules = [Rule("blocks.*.attn.qkv.weight", ("tensor", "fsdp")),
             Rule("head.weight", ("tensor", None))]  # fmt: skip
    specs = layout(PARAMS, SHAPES, rules, MESH)
    assert specs == {"qkv": ("tensor", "fsdp"), "norm": ("fsdp",), "embed": ("tensor", None)}


def test_a_tensor_rule_leaves_the_parameter_to_fsdp_on_a_mesh_without_tensor():
    """It lays a tensor rule's parameter out as FSDPv2 does (the largest dimension over fsdp)
    on a mesh without a tensor axis, keeps the rule's fsdp entry with one, and drops the
    axes a mesh lacks from a rule that names no model axis."""
    rules = [Rule("blocks.*.attn.qkv.weight", ("tensor", "fsdp"))]
    rows, columns = SHAPES["qkv"]
    assert rows > columns  # the largest dimension is the first, the rule's fsdp the second
    assert layout(PARAMS, SHAPES, rules, {"fsdp": 8})["qkv"] == ("fsdp", None)
    assert layout(PARAMS, SHAPES, rules, {"fsdp": 4, "tensor": 2})["qkv"] == ("tensor", "fsdp")
    data_rule = [Rule("blocks.*.attn.qkv.weight", (None, ("data", "fsdp")))]
    assert layout(PARAMS, SHAPES, data_rule, {"fsdp": 8})["qkv"] == (None, "fsdp")
    assert layout(PARAMS, SHAPES, [], {"data": 8})["qkv"] == (None, None)  # spmd: whole


BAD_RULES = {
    "matches nothing": (
        [["blocks.*.attn.qkvv.weight", ["tensor", "fsdp"]]],
        MESH,
        "sharding rule 'blocks.*.attn.qkvv.weight' matches no parameter",
    ),
    "unknown axis": (
        [["blocks.*.attn.qkv.weight", ["model", None]]],
        MESH,
        "rule 'blocks.*.attn.qkv.weight' names unknown mesh axis 'model'",
    ),
    "wrong rank": (
        [["blocks.*.norm.weight", ["tensor", "fsdp"]]],
        MESH,
        "rule 'blocks.*.norm.weight' gives 2 dimension(s) but parameter",
    ),
    "tensor not dividing": (
        [["blocks.*.attn.qkv.weight", ["tensor", "fsdp"]]],
        {"fsdp": 1, "tensor": 5},
        "tensor=5 does not divide dimension 0 (96) of parameter 'blocks.0.attn.qkv.weight'",
    ),
    "tensor axis unused": ([], MESH, "the mesh has tensor=2 but no rule splits a parameter"),
    "expert not dividing": (
        [["embed.weight", ["expert", "fsdp"]]],
        {"fsdp": 1, "expert": 3},
        "expert=3 does not divide dimension 0 (256) of parameter 'embed.weight'",
    ),
    "expert axis unused": (
        [],
        {"fsdp": 2, "expert": 4},
        "the mesh has expert=4 but no rule splits a parameter",
    ),
}


@pytest.mark.parametrize("rules,mesh,message", BAD_RULES.values(), ids=BAD_RULES)
def test_bad_rules_are_refused_with_what_is_wrong(rules, mesh, message):
    """It refuses a rule that cannot apply, naming the rule or the parameter."""
    with pytest.raises(RuntimeConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        layout(PARAMS, SHAPES, parse_rules(rules, "sharding_rules"), mesh)


def test_only_the_outermost_axis_crosses_slices():
    """It splits the outermost axis over the slices and keeps the rest inside each slice."""
    assert over_slices(parse_mesh("data=4,fsdp=8"), 2) == ((2, 8), (2, 1))
    assert over_slices(parse_mesh("fsdp=16,tensor=4"), 4) == ((4, 4), (4, 1))
    assert over_slices(parse_mesh("fsdp=8"), 1) == ((8,), (1,))
    with pytest.raises(RuntimeConfigError, match="outermost axis 'data' \\(3\\) must be a mult"):
        over_slices(parse_mesh("data=3,fsdp=8"), 2)
{%- if cookiecutter.example_task == "lm" %}


STEPS = 20
GLOBAL_BATCH = 16
MESHES = ["fsdp=4,tensor=2", "data=2,fsdp=2,tensor=2"]


def train(folder: Path, *args: str, **overrides: Any) -> dict[str, Any]:
    """The tiny example logging every loss, in fp32 (layouts change summation orders)."""
    settings = {"max_steps": STEPS, "log_every": 1, "seed": 5, "precision": "32-true"}
    folder.mkdir(exist_ok=True)
    config = write_config(folder, **{**settings, **overrides})
    run_dir = folder / "run"
    result = cli("train", "--config", str(config), "--run-dir", str(run_dir), *args)
    assert result.returncode == 0, result.stderr[-3000:]
    return {**json.loads((run_dir / "summary.json").read_text()), "stdout": result.stdout}


def on_mesh(mesh: str) -> tuple[str, ...]:
    """The flags of a run on 8 devices at GLOBAL_BATCH: batch_size is per device of the data
    axes (a tensor group shares its samples)."""
    tensor = int(mesh.rpartition("tensor=")[2]) if "tensor=" in mesh else 1
    batch = str(GLOBAL_BATCH * tensor // 8)
    return ("--devices", "8", "--strategy", "fsdp", "--mesh", mesh, "--batch-size", batch)


@pytest.fixture(scope="module")
def one_device(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("one")
    return train(folder, "--devices", "1", "--strategy", "single", "--batch-size", "16")


@pytest.mark.slow
@pytest.mark.parametrize("mesh", MESHES)
def test_2d_mesh_trains_like_one_device_on_a_share_of_the_memory(
    mesh: str, one_device: dict[str, Any], tmp_path: Path
) -> None:
    """It gives one device's losses on a 2D mesh, one graph, the state split as planned."""
    run = train(tmp_path, *on_mesh(mesh))
    replicated = train(tmp_path / "spmd", "--devices", "8", "--strategy", "spmd",
                       "--batch-size", "2", "--max-steps", "1")  # fmt: skip

    assert f"mesh {mesh}" in run["stdout"]
    worst = max(
        abs(a - b) / abs(b)
        for (_, a), (_, b) in zip(run["train_losses"], one_device["train_losses"], strict=True)
    )
    assert worst <= 1e-5, worst
    assert run["loop_compilations"] == 1 and run["diagnosis"] == []
    sharded, whole = run["memory"], replicated["memory"]
    assert whole["state_bytes_per_device"] == whole["state_bytes_total"]
    share = 8 // dict(parse_mesh(mesh)).get("data", 1)  # data replicas hold the same share
    assert sharded["state_bytes_per_device"] < 1.6 * whole["state_bytes_total"] / share


@pytest.mark.slow
def test_2d_checkpoint_evaluates_on_one_device_and_resumes_under_fsdp(
    one_device: dict[str, Any], tmp_path: Path
) -> None:
    """It reads a fsdp x tensor checkpoint on one device and continues it under fsdp=8."""
    checkpoints = tmp_path / "run" / "checkpoints"
    first = train(tmp_path, *on_mesh("fsdp=4,tensor=2"), checkpoint_every=STEPS // 2)
    evaluated = cli("eval", "--checkpoint", str(checkpoints), "--devices", "1",
                    "--strategy", "single")  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert json.loads(evaluated.stdout.splitlines()[-1])["loss"] == pytest.approx(
        first["eval"]["loss"], rel=1e-5
    )

    halfway = str(checkpoints / str(STEPS // 2))
    resumed = train(tmp_path / "fsdp", "--devices", "8", "--strategy", "fsdp", "--mesh",
                    "fsdp=8", "--batch-size", "2", "--resume", halfway)  # fmt: skip
    assert [step for step, _ in resumed["train_losses"]] == list(range(1, STEPS + 1))
    for (step, loss), (_, reference) in zip(
        resumed["train_losses"], one_device["train_losses"], strict=True
    ):  # a third layout sums in yet another order: rounding, compounded over steps
        assert loss == pytest.approx(reference, rel=1e-4), step


def rule(pattern: str, axes: str) -> list[str]:
    """The command-line flag of one sharding rule (TOML: "" for a dimension kept whole)."""
    return ["--set", f'sharding_rules=[["{pattern}", {axes}]]']


BAD_MESHES = {
    "tensor not dividing the heads": (
        ["--mesh", "fsdp=2,tensor=4"],
        "error: tensor=4 does not divide the model's 2 attention heads (task option heads)",
    ),
    "unknown axis in a rule": (
        ["--mesh", "fsdp=8", *rule("blocks.*.attn.qkv.weight", '["model", ""]')],
        "error: sharding_rules: rule 'blocks.*.attn.qkv.weight' names unknown mesh axis 'model'",
    ),
    "rule matching nothing": (
        ["--mesh", "fsdp=8", *rule("blocks.*.attn.qkvv.weight", '["fsdp", ""]')],
        "error: sharding rule 'blocks.*.attn.qkvv.weight' matches no parameter",
    ),
    "axes not dividing the devices": (
        ["--mesh", "fsdp=3,tensor=2"],
        "error: mesh 'fsdp=3,tensor=2' has 6 devices but the job has 8",
    ),
}


@pytest.mark.parametrize("args,start", BAD_MESHES.values(), ids=BAD_MESHES)
def test_bad_sharding_requests_fail_in_one_line(args: list[str], start: str, tmp_path: Path):
    """It refuses a mesh or rule that cannot lay the model out: one line, exit 2, no run."""
    config = write_config(tmp_path, max_steps=2)
    run_dir = tmp_path / "run"
    result = cli("train", "--config", str(config), "--run-dir", str(run_dir), "--devices", "8",
                 "--strategy", "fsdp", "--batch-size", "2", *args)  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(start), lines
    assert not run_dir.exists()
{%- endif %}


def test_a_hosts_shards_that_tile_a_box_are_read_as_that_box():
    """It reads the shards of one host's devices as one region when they fill it exactly
    (each shard read apart would fetch the rows they share again: over gs:// a row's
    columns are one request), and apart when they leave holes in it or are one."""
    from {{ cookiecutter.package_name }}.core.strategies.spmd import _tiled_region

    columns = {((0, 4), (0, 2)), ((0, 4), (2, 4)), ((0, 4), (4, 6)), ((0, 4), (6, 8))}
    assert _tiled_region(columns) == ((0, 4), (0, 8))
    grid = {((0, 2), (0, 4)), ((0, 2), (4, 8)), ((2, 4), (0, 4)), ((2, 4), (4, 8))}
    assert _tiled_region(grid) == ((0, 4), (0, 8))
    apart = {((0, 2), (0, 4)), ((2, 4), (4, 8))}  # a diagonal: half the box is another host's
    assert _tiled_region(apart) is None
    assert _tiled_region({((0, 4), (0, 8))}) is None
