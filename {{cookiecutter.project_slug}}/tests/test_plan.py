"""`plan` sizes a run before a TPU is rented: the bytes a real run measures, the activations
autograd keeps, the smallest slice that fits, and one clear line for every bad input."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from typer.testing import CliRunner

from {{ cookiecutter.package_name }}.cli import app
from {{ cookiecutter.package_name }}.core import tpu_generations
from {{ cookiecutter.package_name }}.core.sharding import Rule
from {{ cookiecutter.package_name }}.planning import host_memory
from {{ cookiecutter.package_name }}.planning.activations import record
from {{ cookiecutter.package_name }}.planning.estimate import Accelerator, BatchSize, Planner
from {{ cookiecutter.package_name }}.planning.workload import Workload, from_task
from {{ cookiecutter.package_name }}.training.config import build_config

from readme_inventory import documented_commands
from training_helpers import TINY, cli, cli_env, cli_json, write_config

runner = CliRunner()
{%- if cookiecutter.backend == "torch_tpu" %}
# The runs measured: a v5e slice of 4 devices, as 4 CPU processes (each a process to start).
MEASURED_TYPE = "v5e-4"
MEASURED_DEVICES = "4"
{%- if cookiecutter.example_task == "vision" %}
# The vision example has no tensor-parallel rules: its meshes split the batch and the state.
MEASURED_MESHES = ["data=2,fsdp=2"]
{%- else %}
MEASURED_MESHES = ["fsdp=2,tensor=2"]
{%- endif %}
{%- else %}
# The runs measured: the project's slice of 8 devices, on 8 XLA:CPU devices.
MEASURED_TYPE = "v5e-8"
MEASURED_DEVICES = "8"
{%- if cookiecutter.example_task == "vision" %}
# The vision example has no tensor-parallel rules: its meshes split the batch and the state.
MEASURED_MESHES = ["fsdp=8", "data=2,fsdp=4"]
{%- else %}
MEASURED_MESHES = ["fsdp=8", "fsdp=4,tensor=2"]
{%- endif %}
{%- endif %}


def plan(*args: str) -> dict[str, Any]:
    """`plan --json` in a fresh process, as a user runs it."""
    return dict(json.loads(cli_json("plan", *args)))


@pytest.mark.slow
@pytest.mark.parametrize("mesh", MEASURED_MESHES)
def test_plan_gives_the_bytes_per_device_a_run_measures(tmp_path: Path, mesh: str) -> None:
    """It estimates the parameter and AdamW bytes per device a sharded run reports, exactly."""
    config = write_config(tmp_path, max_steps=2)
    run_dir = tmp_path / "run"
    trained = cli(
        "train", "--config", str(config), "--devices", MEASURED_DEVICES, "--strategy", "fsdp",
        "--mesh", mesh, "--run-dir", str(run_dir),
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    measured = json.loads((run_dir / "summary.json").read_text())["memory"]

    planned = json.loads(
        cli_json("plan", "--config", str(config), "--mesh", mesh, accelerator_type=MEASURED_TYPE)
    )["per_device"]

    assert planned["param_bytes"] == measured["param_bytes_per_device"]
    assert planned["optimizer_bytes"] == measured["optimizer_bytes_per_device"]
    state = planned["param_bytes"] + planned["optimizer_bytes"]
    assert state == measured["state_bytes_per_device"]
    assert state < measured["state_bytes_total"]  # split: the layout matters, not the sum


def test_plan_runs_without_starting_torch_xla(tmp_path: Path) -> None:
    """It plans in a fresh process without importing torch_xla, and its parts add up."""
    config = write_config(tmp_path)
    code = (
        "import json, sys\n"
        "from typer.testing import CliRunner\n"
        "from {{ cookiecutter.package_name }}.cli import app\n"
        f"args = ['plan', '--config', {str(config)!r}, '--accelerator-type', 'v5e-8', '--json']\n"
        "result = CliRunner().invoke(app, args)\n"
        "print(json.dumps({'exit': result.exit_code, 'output': result.output,\n"
        "                  'torch_xla': 'torch_xla' in sys.modules}))\n"
    )
    done = cli_python(code)
    assert done["exit"] == 0, done["output"]
    assert not done["torch_xla"]
    report = json.loads(done["output"])
    part = report["per_device"]
    assert report["mesh"] == "fsdp=8" and report["devices"] == 8
    assert report["global_batch"] == 8 * TINY["batch_size"]
    state = part["param_bytes"] + part["gradient_bytes"] + part["optimizer_bytes"]
    # The larger of a training step's activations and an evaluation's (its batch: 16/device).
    activations = max(part["activation_bytes"], part["eval_activation_bytes"])
    assert part["eval_activation_bytes"] > 0
    assert part["total_bytes"] == state + part["gathered_bytes"] + activations
    assert report["usable_bytes_per_device"] == int(16 * 2**30 * 0.9)  # v5e: 16 GiB per chip
    assert report["fits"] == {"without_checkpointing": True, "with_checkpointing": True}


def cli_python(code: str) -> dict[str, Any]:
    """Run `code` in a fresh interpreter and read the JSON it prints last."""
    done = subprocess.run(
        [sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


class MegatronMlp(nn.Module):
    """A column-split layer, then a row-split one: one all-reduce, as in Megatron-LM."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Stack(nn.Module):
    """`layers` blocks of Linear + tanh, so each block saves its input and its output."""

    def __init__(self, dim: int, layers: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(TanhBlock(dim) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class TanhBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


@dataclass
class ToyTask:
    """Just what a planner asks of a task: a model, a loss, a name, optional rules and blocks."""

    make: Callable[[], nn.Module]
    name: str = "toy"
    sharding_rules: tuple[Rule, ...] = ()
    block_class: type[nn.Module] | None = None

    def build_model(self) -> nn.Module:
        return self.make()

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(batch["x"]).square().mean()


MEGATRON_RULES = (
    Rule("up.weight", ("tensor", None)),
    Rule("up.bias", ("tensor",)),
    Rule("down.weight", (None, "tensor")),
)


def toy_workload(task: ToyTask, dim: int, **config: Any) -> Workload:
    sample = {"x": torch.zeros(dim)}
    settings = {"precision": "32-true", **config}  # whatever precision the project defaults to
    return Workload(task, build_config(None, settings), sample)  # type: ignore[arg-type]


def test_tensor_axis_splits_what_column_split_layers_produce() -> None:
    """It splits the saved tensors between a colwise and a rowwise layer over `tensor`."""
    dim, samples = 8, 4
    task = ToyTask(lambda: MegatronMlp(dim), sharding_rules=MEGATRON_RULES)
    planner = Planner(toy_workload(task, dim))

    estimate = planner.estimate((("tensor", 2),), BatchSize(global_batch=samples))

    fp32 = 4
    whole = samples * dim * fp32 * 2  # up's input, and down's output (the loss squares it)
    split = samples * 4 * dim * fp32 * 2  # gelu's input, down's input: half on each device
    assert estimate.activations == whole + split // 2
    unsplit = planner.estimate((("fsdp", 1),), BatchSize(global_batch=samples))
    assert unsplit.activations == whole + split


def test_bf16_mixed_saves_bf16_copies_as_xla_autocast_makes_them() -> None:
    """It records bf16 matmul inputs, and bf16 weight copies laid out like their weights."""
    dim, samples = 8, 4
    task = ToyTask(lambda: MegatronMlp(dim), sharding_rules=MEGATRON_RULES)
    planner = Planner(toy_workload(task, dim, precision="bf16-mixed"))

    estimate = planner.estimate((("tensor", 2),), BatchSize(global_batch=samples))

    bf16 = 2
    whole = samples * dim * bf16 * 2  # up's bf16 input, down's bf16 output
    split = samples * 4 * dim * bf16 * 2  # gelu's and down's bf16 inputs
    # down's bf16 weight, half on each device; up's is not kept: its input, the batch, needs
    # no gradient
    weights = 4 * dim * dim * bf16 // 2
    assert estimate.activations == whole + split // 2 + weights


def test_checkpointing_keeps_block_inputs_and_one_recomputed_block() -> None:
    """It counts, under activation checkpointing, the blocks' inputs, what is saved after
    them, and one block's recomputed tensors; without it, everything saved once."""
    dim, samples, layers = 8, 4, 5
    task = ToyTask(lambda: Stack(dim, layers), block_class=TanhBlock)
    planner = Planner(toy_workload(task, dim))

    estimate = planner.estimate((("fsdp", 1),), BatchSize(global_batch=samples))

    one = samples * dim * 4  # one [samples, dim] fp32 activation
    assert estimate.activations == (layers + 1) * one  # every block's input, the last output
    # layers inputs kept; the last output, saved by the loss; the last block's, recomputed
    assert estimate.activations_checkpointed == (layers + 2) * one


@pytest.mark.parametrize("samples", [1, 5])
def test_activations_grow_linearly_with_the_batch(samples: int) -> None:
    """It extends activations recorded at 2 and 3 samples to any batch, as a forward would."""
    options = {key: value for key, value in TINY.items() if key != "eval_batch_size"}
    workload = from_task(build_config(None, {**options, "precision": "32-true"}))
    planner = Planner(workload)

    estimate = planner.estimate((("fsdp", 1),), BatchSize(global_batch=samples))

    recorded = record(workload, samples, {}, autocast=False).kept
    assert estimate.activations == recorded.whole + recorded.split


def test_smallest_slice_is_the_fewest_devices_that_fit() -> None:
    """It names the smallest slice whose devices hold the run, and no smaller one does."""
    dim = 64
    task = ToyTask(lambda: MegatronMlp(dim), sharding_rules=MEGATRON_RULES)
    planner = Planner(toy_workload(task, dim))
    generation = tpu_generations.generations()["v5litepod"]
    batch = BatchSize(per_device=2)
    usable = planner.estimate((("fsdp", 1),), batch).total(False) // 3

    found = planner.smallest(generation, batch, False, usable)

    assert found is not None
    accelerator, estimate = found
    assert estimate.total(False) <= usable
    size = int(accelerator.split("-")[1])
    assert size > 1
    smaller = [s for s in generation.slice_sizes if s < size]
    for devices in map(generation.devices, smaller):
        for tensor in (t for t in (1, 2, 4, 8) if devices % t == 0):
            mesh = (("fsdp", devices // tensor), ("tensor", tensor))
            assert planner.estimate(mesh, batch).total(False) > usable, mesh


def test_plan_prints_a_table_and_a_verdict(tmp_path: Path) -> None:
    """It prints every part per device, the device's memory, the verdict and the smallest slice."""
    config = write_config(tmp_path)
    done = cli("plan", "--config", str(config), "--accelerator-type", "v5p-8", "--batch-size", "2")

    assert done.returncode == 0, done.stderr[-3000:]
    rows = {line.split("│")[1].strip(): line for line in done.stdout.splitlines() if "│" in line}
    for row in ("parameters", "gradients", "optimizer state", "activations (model)", "total"):
        assert "B │" in rows[row], row  # a size in both columns
    assert rows["verdict"].count("fits") == 2 and "does not" not in rows["verdict"]
    assert "v5p-8: 4 devices of 95.0 GiB HBM; mesh fsdp=4" in done.stdout
    assert "smallest v5p slice that fits (no checkpointing): v5p-8, mesh fsdp=4" in done.stdout


def test_make_plan_plans_for_the_projects_tpu(tmp_path: Path) -> None:
    """It plans through `make plan` for ACCELERATOR_TYPE, passing ARGS on."""
    project = Path(__file__).resolve().parents[1]
    config = write_config(tmp_path)
    result = subprocess.run(
        ["make", "-sC", str(project), f"VENV={sys.prefix}", "plan", "ACCELERATOR_TYPE=v6e-8",
         f"ARGS=--config {config} --mesh data=2,fsdp=4 --json"],
        env=cli_env(), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert (report["accelerator_type"], report["mesh"]) == ("v6e-8", "data=2,fsdp=4")
    assert report["hbm_bytes_per_device"] == 32 * 2**30  # v6e: 32 GiB per chip


{% if cookiecutter.example_task == "lm" -%}
SPLIT_POSITIONS = 'sharding_rules=[["position", ["tensor", "-", "-"]]]'
MODEL_MESH_ERRORS = {
    "tensor-vs-heads": (
        ["--mesh", "fsdp=2,tensor=4"],
        "does not divide the model's 2 attention heads",
    ),
    "tensor-vs-parameter": (
        ["--mesh", "fsdp=4,tensor=2", "--set", SPLIT_POSITIONS],
        "does not divide dimension 0 (1) of parameter 'position'",
    ),
    "unknown-axis-in-rule": (
        ["--set", 'sharding_rules=[["embed.weight", ["model", "-"]]]'],
        "names unknown mesh axis 'model'",
    ),
}
{%- elif cookiecutter.example_task == "hf-causal-lm" -%}
MODEL_MESH_ERRORS = {
    "tensor-vs-heads": (["--mesh", "fsdp=2,tensor=4"], "does not divide the model's 2 heads"),
    "tensor-vs-parameter": (
        ["--mesh", "fsdp=4,tensor=2", "--set", "task_options.mlp_dim=33"],
        "does not divide dimension 0 (33) of parameter 'model.layers.0.mlp.gate_proj.weight'",
    ),
    "unknown-axis-in-rule": (
        ["--set", 'sharding_rules=[["lm_head.weight", ["model", "-"]]]'],
        "names unknown mesh axis 'model'",
    ),
}
{%- else -%}
SPLIT_CLASSES = 'sharding_rules=[["classifier.1.weight", ["tensor", "-"]]]'
MODEL_MESH_ERRORS = {
    "tensor-without-rules": (["--mesh", "fsdp=4,tensor=2"], "no rule splits a parameter over it"),
    "tensor-vs-parameter": (
        ["--mesh", "fsdp=2,tensor=4", "--set", SPLIT_CLASSES],
        "does not divide dimension 0 (10) of parameter 'classifier.1.weight'",
    ),
    "unknown-axis-in-rule": (
        ["--set", 'sharding_rules=[["classifier.1.weight", ["model", "-"]]]'],
        "names unknown mesh axis 'model'",
    ),
}
{%- endif %}


@pytest.mark.parametrize("args,message", MODEL_MESH_ERRORS.values(), ids=MODEL_MESH_ERRORS.keys())
def test_plan_refuses_a_mesh_the_model_cannot_take(
    tmp_path: Path, args: list[str], message: str
) -> None:
    """It names the heads, the parameter or the rule that does not fit the mesh, in one line."""
    config = write_config(tmp_path)
    done = cli("plan", "--config", str(config), "--accelerator-type", "v5e-8", *args)
    assert done.returncode == 2, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert message in lines[0]


BAD_REQUESTS = {
    "axis-does-not-divide": (["--mesh", "fsdp=3"], "axis fsdp=3 does not divide the 8 devices"),
    "mesh-too-small": (["--mesh", "fsdp=4"], "mesh 'fsdp=4' has 4 devices but v5litepod-8 has 8"),
    "unknown-mesh-axis": (["--mesh", "model=8"], "unknown mesh axis 'model'"),
    "unknown-accelerator": (["--accelerator-type", "v9-8"], "unknown accelerator type 'v9-8'"),
    "bad-slice-size": (["--accelerator-type", "v5p-6"], "is not a v5p slice"),
    "missing-config": (["--config", "/no/such.toml"], "config file '/no/such.toml' does not exist"),
    "batch-does-not-split": (["--global-batch", "12"], "global batch of 12 does not split into"),
{%- if cookiecutter.backend == "torch_tpu" %}
    "legacy-precision": (["--precision", "bf16-env"], "use bf16-true (bf16 weights)"),
{%- else %}
    "legacy-precision": (["--precision", "bf16-env"], "plan it as --precision bf16-true"),
{%- endif %}
    "both-batches": (["--batch-size", "2", "--global-batch", "16"], "not both"),
    "hf-config-without-seq-len": (["--hf-config", "any"], "--hf-config needs --seq-len"),
    "architecture-without-size": (["--architecture", "llama"], "needs --size (a known size"),
    "size-without-architecture": (["--size", "8b", "--seq-len", "8"], "give both"),
    "two-model-sources": (
        ["--architecture", "llama", "--size", "8b", "--hf-config", "any"],
        "--hf-config or --architecture, not both",
    ),
}


@pytest.mark.parametrize("args,message", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_plan_refuses_bad_requests_in_one_line(args: list[str], message: str) -> None:
    """It rejects a bad mesh, accelerator, config or batch with one line and exit code 2."""
    result = runner.invoke(app, ["plan", "--accelerator-type", "v5e-8", *args])

    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0]


def test_plan_sizes_a_hugging_face_config_without_its_weights(tmp_path: Path) -> None:
    """It builds a decoder from a saved config alone, LoRA included, and lays it out."""
    transformers = pytest.importorskip("transformers", reason="--hf-config needs the hf extra")
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=512, max_position_embeddings=128,
    )  # fmt: skip
    config.save_pretrained(tmp_path / "llama")
    total = sum(p.numel() for p in transformers.LlamaForCausalLM(config).parameters())
    args = ["--hf-config", str(tmp_path / "llama"), "--seq-len", "32", "--batch-size", "1"]

    replicated = json.loads(cli_json("plan", *args, "--mesh", "data=8"))
    split = json.loads(cli_json("plan", *args, "--mesh", "fsdp=4,tensor=2", "--set", "lora.rank=4"))

    assert replicated["per_device"]["param_bytes"] == total * 4  # fp32, whole on every device
    assert replicated["per_device"]["gathered_bytes"] == 0  # nothing to gather without fsdp
    assert split["parameters"].startswith("parameters: ")
    assert 0 < split["per_device"]["gradient_bytes"] < split["per_device"]["param_bytes"] / 10
    assert split["blocks"] == 2


{%- if cookiecutter.example_task == "hf-causal-lm" %}


def test_plan_of_a_fine_tuning_builds_its_model_from_the_saved_config(tmp_path: Path) -> None:
    """It plans a run whose `model_name` is saved weights as the run builds it: from the
    saved config on the meta device, no weight read (the figures of `--hf-config`)."""
    from hf_helpers import save_tiny_pretrained

    base = save_tiny_pretrained(tmp_path / "base")
    options = {"model_name": str(base), "seq_len": 16, "max_bytes": 40_000}
    config = write_config(tmp_path, task_options=options)
    shape = ["--batch-size", "2", "--mesh", "fsdp=4,tensor=2"]

    run = plan("--config", str(config), *shape)
    saved = plan("--hf-config", str(base), "--seq-len", "16", *shape)

    kinds = ("param_bytes", "gradient_bytes", "optimizer_bytes", "gathered_bytes")
    assert {k: run["per_device"][k] for k in kinds} == {k: saved["per_device"][k] for k in kinds}
    assert run["parameters"] == saved["parameters"] and run["per_device"]["param_bytes"] > 0
{%- endif %}


LLAMA3 = {  # the published configs' shapes (meta-llama/Meta-Llama-3-8B, -70B, Llama-3.1-405B)
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256},
    "70b": {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
            "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256},
    "405b": {"hidden_size": 16384, "intermediate_size": 53248, "num_hidden_layers": 126,
             "num_attention_heads": 128, "num_key_value_heads": 8, "vocab_size": 128256},
}  # fmt: skip
SHORT = ["--seq-len", "64", "--batch-size", "1", "--precision", "bf16-mixed", "--mesh", "fsdp=8"]


def needs_transformers() -> Any:
    return pytest.importorskip("transformers", reason="a Hugging Face model needs the hf extra")


def llama_parameters(size: str) -> int:
    """Parameters of a LlamaForCausalLM of that size, counted on the meta device."""
    transformers = needs_transformers()
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA3[size]))
    return sum(p.numel() for p in model.parameters())


def test_llama3_8b_by_name_plans_as_its_saved_config(tmp_path: Path) -> None:
    """It plans `--architecture llama --size 8b` byte for byte as Llama 3 8B's saved config."""
    count = llama_parameters("8b")
    needs_transformers().LlamaConfig(**LLAMA3["8b"]).save_pretrained(tmp_path / "8b")

    by_name = plan("--architecture", "llama", "--size", "8b", *SHORT)
    saved = plan("--hf-config", str(tmp_path / "8b"), *SHORT)

    assert by_name["parameter_count"] == saved["parameter_count"] == count
    assert by_name["per_device"] == saved["per_device"]
    fp32_share = count * 4 / 8  # bf16-mixed keeps fp32 weights; fsdp=8 splits them 8 ways
    assert fp32_share <= by_name["per_device"]["param_bytes"] < 1.001 * fp32_share


def test_llama3_70b_by_name_has_its_parameters() -> None:
    """It builds Llama 3 70B's shape by name, and 70B parameters do not fit one v5e-8."""
    count = llama_parameters("70b")

    report = plan("--architecture", "llama", "--size", "70b", *SHORT)

    assert report["parameter_count"] == count
    assert report["fits"] == {"without_checkpointing": False, "with_checkpointing": False}
    found = report["smallest"]["with_checkpointing"]
    assert int(found["accelerator_type"].split("-")[1]) > 8
    assert found["per_device"]["total_bytes_checkpointed"] <= report["usable_bytes_per_device"]


def test_mixtral_8x7b_by_name_has_its_sizes_and_splits_its_experts() -> None:
    """It builds Mixtral 8x7B by name, 46.7B parameters of which 12.9B active per token (the
    published figures), and holds an eighth of the experts per device on fsdp=2,expert=4."""
    transformers = needs_transformers()

    mesh = ["--mesh", "fsdp=2,expert=4"]
    report = plan("--architecture", "mixtral", "--size", "8x7b", *SHORT[:-2], *mesh)

    config = transformers.MixtralConfig(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, num_local_experts=8,
        num_experts_per_tok=2, tie_word_embeddings=False,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.MixtralForCausalLM(config)
    experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    rest = sum(p.numel() for name, p in model.named_parameters() if ".experts." not in name)
    assert report["parameter_count"] == experts + rest
    assert round(report["parameter_count"] / 1e9, 1) == 46.7
    assert report["active_parameter_count"] == rest + experts * 2 // 8
    assert round(report["active_parameter_count"] / 1e9, 1) == 12.9
    # fp32 weights (bf16-mixed): the experts over expert x fsdp, the rest over fsdp alone.
    assert report["per_device"]["param_bytes"] == 4 * (experts // 8 + rest // 2)


def test_llama4_scout_by_name_plans_as_its_saved_config_with_its_published_sizes(
    tmp_path: Path,
) -> None:
    """It plans `--architecture llama4_text --size scout` as Llama 4 Scout's saved text config:
    its 17B active parameters of about 108B (109B with the vision encoder), an eighth of its
    16 experts per device on fsdp=2,expert=4."""
    transformers = needs_transformers()
    config = transformers.Llama4TextConfig(
        vocab_size=202048, hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384,
        num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
        num_local_experts=16, num_experts_per_tok=1, interleave_moe_layer_step=1,
        max_position_embeddings=10485760, tie_word_embeddings=False,
    )  # fmt: skip
    config.save_pretrained(tmp_path / "scout")
    with torch.device("meta"):
        model = transformers.Llama4ForCausalLM(config)
    experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    rest = sum(p.numel() for name, p in model.named_parameters() if ".experts." not in name)
    mesh = ["--mesh", "fsdp=2,expert=4"]

    by_name = plan("--architecture", "llama4_text", "--size", "scout", *SHORT[:-2], *mesh)
    saved = plan("--hf-config", str(tmp_path / "scout"), *SHORT[:-2], *mesh)

    assert by_name["parameter_count"] == saved["parameter_count"] == experts + rest
    assert round(by_name["parameter_count"] / 1e9) == 108
    assert by_name["active_parameter_count"] == rest + experts // 16
    assert round(by_name["active_parameter_count"] / 1e9) == 17
    assert by_name["per_device"] == saved["per_device"]
    # fp32 weights (bf16-mixed): the experts over expert x fsdp, the rest over fsdp alone.
    assert by_name["per_device"]["param_bytes"] == 4 * (experts // 8 + rest // 2)


ARCHITECTURE_ERRORS = {
    "unknown-size": (["--size", "13b"], "'13b' is not a known llama size: llama sizes are 8b, 70b"),
    "size-left-out": (["--size", "dim=64"], "--size leaves out vocab, layers, heads"),
    "unknown-field": (["--size", "8b,width=3"], "--size field 'width' is unknown"),
    "unknown-architecture": (
        ["--architecture", "bert", "--size", "8b"],
        "unknown architecture 'bert'",
    ),
    "tensor-vs-heads": (
        ["--size", "vocab=256,dim=48,layers=1,heads=6", "--mesh", "fsdp=2,tensor=4"],
        "tensor=4 does not divide the model's 6 heads",
    ),
}


@pytest.mark.parametrize("args,message", ARCHITECTURE_ERRORS.values(), ids=ARCHITECTURE_ERRORS)
def test_plan_refuses_a_shape_it_cannot_build_in_one_line(args: list[str], message: str) -> None:
    """It names the size, field, architecture or head count that is wrong, exit code 2."""
    needs_transformers()
    request = ["plan", "--accelerator-type", "v5e-8", "--seq-len", "16", "--architecture", "llama"]

    result = runner.invoke(app, [*request, *args])

    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0]


def test_a_sequence_too_long_for_the_mesh_grows_the_context_axis(tmp_path: Path) -> None:
    """It says to grow `context` when activations outweigh the state, and proposes the first
    layout of the same slice that fits: the sequence split over a context axis."""
    from {{ cookiecutter.package_name }}.planning.cli import Request, make_plan

    options = {**TINY["task_options"], "seq_len": 512}
    config = write_config(tmp_path, task_options=options)

    def planned(margin: float) -> Any:
        request = Request(config, [], None, None, None, "v5litepod-8", "fsdp=8", None, None,
                          None, None, None, margin)  # fmt: skip
        return make_plan(request)

    roomy = planned(0.1)
    assert roomy.axis_to_grow(False) is None
    hbm = roomy.accelerator.hbm_bytes_per_device
    tight = planned(1 - 0.6 * roomy.estimate.total(False) / hbm)  # 60% of what fsdp=8 needs

    assert tight.axis_to_grow(False) == "context"
    proposed = tight.proposed[False]
    assert proposed is not None and dict(proposed.mesh).get("context", 1) > 1, proposed
    assert proposed.total(False) <= tight.usable_bytes


def test_every_generation_gives_its_host_ram_or_says_google_gives_none() -> None:
    """It gives each generation's host RAM for every host its slices have, citing the Cloud
    TPU page, or says that page gives none; the docs show the same."""
    docs = (Path(__file__).resolve().parents[1] / "docs" / "tpu-generations.md").read_text()
    for key, generation in tpu_generations.generations().items():
        assert generation.host_ram_source.startswith("https://cloud.google.com/tpu/docs/"), key
        assert f"{generation.host_ram_note} (<{generation.host_ram_source}>)" in docs, key
        figures = dict(generation.host_ram_gb_per_vm)
        if not figures:
            assert generation.host_ram_note.startswith("not found"), key
            assert generation.host_ram_bytes(generation.slice_sizes[0]) is None
            continue
        for size in generation.slice_sizes:
            gb = figures[generation.chips_on_a_host(size)]  # every host of every slice
            assert generation.host_ram_bytes(size) == int(gb * 10**9), (key, size)
    # Multi-host v5e slices run on 4-chip VMs, not on the 8-chip one.
    assert Accelerator.parse("v5e-256").generation.host_ram_bytes(256) == 192 * 10**9


def test_host_ram_is_the_baseline_and_the_largest_tensor_read_and_converted() -> None:
    """It needs on a host the process baseline and the largest tensor read in bf16 and
    converted to fp32 to load a decoder; to export, that tensor gathered and converted back
    and the writer's buffers."""
    transformers = needs_transformers()
    config = transformers.LlamaConfig(
        vocab_size=1000, hidden_size=64, intermediate_size=200, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
    )  # fmt: skip
    with torch.device("meta"):
        largest = max(p.numel() for p in transformers.LlamaForCausalLM(config).parameters())
    size = "vocab=1000,dim=64,mlp_dim=200,layers=2,heads=4,kv_heads=2"

    report = plan("--architecture", "llama", "--size", size, "--seq-len", "16",
                  "--precision", "bf16-mixed")  # fmt: skip
    host = report["host_memory"]

    baseline = host_memory.BASELINE_BYTES[tpu_generations.BACKEND] + host_memory.HUGGING_FACE_BYTES
    # One process per host under torch_xla, one per device under torch_tpu.
    processes = host_memory.processes_per_host(Accelerator.parse(report["accelerator_type"]))
    assert host["processes_per_host"] == processes
    assert host["baseline_bytes_per_process"] == baseline
    # bf16-mixed keeps fp32 weights: 2 bytes read per element, 4 once converted.
    assert host["loading"]["total_bytes"] == processes * (baseline + largest * 2 + largest * 4)
    writer = host_memory.WRITE_BUFFER_BYTES
    assert host["exporting"]["total_bytes"] == baseline + largest * 4 + largest * 2 + writer
    assert host["host_bytes"] == 384 * 10**9  # v5e-8: one VM of 8 chips
    assert host["loadable"] is True and host["exportable"] is True


def test_torch_tpu_holds_a_tensor_in_each_of_a_hosts_processes() -> None:
    """It counts one process per host under torch_xla and one per device under torch_tpu,
    each reading its own tensor."""
    dim = 64
    workload = toy_workload(ToyTask(lambda: MegatronMlp(dim)), dim)
    v5p = Accelerator.parse("v5p-64")
    largest = 4 * dim * dim * 4  # `up.weight` in fp32, initialized in place: nothing converted

    xla = host_memory.host_memory(workload, v5p, 0.1, backend="torch_xla")
    tpu = host_memory.host_memory(workload, v5p, 0.1, backend="torch_tpu")

    assert (xla.hosts, xla.processes, tpu.processes) == (8, 1, 4)
    assert xla.loading == host_memory.BASELINE_BYTES["torch_xla"] + largest
    assert tpu.loading == 4 * (host_memory.BASELINE_BYTES["torch_tpu"] + largest)


def test_a_tensor_larger_than_a_hosts_ram_cannot_be_loaded() -> None:
    """It reports a model whose largest tensor outgrows a host's RAM as not loadable there."""
    needs_transformers()
    size = "vocab=1000000,dim=32768,layers=1,heads=1,mlp_dim=8"  # a 65.5 GB bf16 embedding
    done = cli("plan", "--architecture", "llama", "--size", size, "--seq-len", "8",
               "--precision", "bf16-true", "--accelerator-type", "v5e-1", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    host = json.loads(done.stdout)["host_memory"]

    assert host["loading"]["tensor_bytes"] == 1_000_000 * 32768 * 2
    assert host["host_bytes"] == 48 * 10**9  # one 1-chip VM
    assert host["loading"]["total_bytes"] > host["usable_host_bytes"]
    assert host["loadable"] is False


def readme_plan(marker: str) -> dict[str, Any]:
    """The documented `plan` command naming `marker` (docs/plan.md), run as written, `--json`."""
    command = next(c for _, c in documented_commands() if " plan " in c and marker in c)
    result = runner.invoke(app, [*shlex.split(command)[1:], "--json"])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def test_readmes_llama31_405b_with_lora_fits_v5e_256_and_its_hosts_can_load_it() -> None:
    """It plans Llama 3.1 405B with LoRA on v5e-256 as the README shows it: it fits with
    activation checkpointing, only the adapters train, and each host can load the bf16 base."""
    count = llama_parameters("405b")
    per_layer = sum(
        rows + columns
        for rows, columns in ((16384, 16384), (16384, 1024), (16384, 1024), (16384, 16384),
                              (16384, 53248), (16384, 53248), (53248, 16384))
    )  # fmt: skip
    adapters = 16 * per_layer * 126  # rank 16 on every linear layer of every block

    report = readme_plan("--size 405b")

    assert report["parameter_count"] == count + adapters
    assert report["fits"]["with_checkpointing"] is True
    # Only the adapters have gradients. (FSDP2 splits each rank-16 A's first dimension 256
    # ways: the first processes hold a whole row of each, 2.6% of the base's bytes.)
    assert report["per_device"]["gradient_bytes"] < report["per_device"]["param_bytes"] / 20
    host = report["host_memory"]
    assert host["loading"]["tensor_bytes"] == 128256 * 16384 * 2  # an embedding, bf16
    assert host["loading"]["converted_bytes"] == 0  # lora.base_bf16: read as it is stored
    assert host["loading"]["total_bytes"] < host["usable_host_bytes"] < host["host_bytes"]
    assert host["loadable"] is True


def test_readmes_llama3_70b_full_fine_tune_fits_v5p_64_and_its_hosts_can_load_it() -> None:
    """It plans Llama 3 70B, every weight trained, on v5p-64 as the README shows it: it fits,
    and each host can load it, its largest tensor read in bf16 and converted to fp32."""
    needs_transformers()  # the README's command names the architecture
    report = readme_plan("--size 70b --seq-len 4096")

    assert report["accelerator_type"] == "v5p-64"
    assert report["fits"]["with_checkpointing"] is True
    assert report["per_device"]["gradient_bytes"] == report["per_device"]["param_bytes"]
    host = report["host_memory"]
    assert host["loading"]["tensor_bytes"] == 128256 * 8192 * 2
    assert host["loading"]["converted_bytes"] == 128256 * 8192 * 4
    assert host["host_bytes"] == 448 * 10**9  # a v5p VM of 4 chips
    assert host["loadable"] is True
