"""Mixtures of experts at the backend's speed: static experts equal to transformers' own,
nothing compiled after warm-up, fsdp (and torch_xla's expert axis) losses equal to one
device's, the router's loss in training."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from backend_facts import (
    MANY_DEVICES,
    MOE_OVER_THE_GLOBAL_BATCH,
    ONE_GRAPH_PER_STEP_KIND,
    one_graph_per_step_kind,
)

pytestmark = pytest.mark.hf

# Three families transformers builds with its experts interface: Mixtral's plain experts,
# Qwen2-MoE's with a shared expert beside them, OLMoE's with normalised queries and keys.
ARCHITECTURES = ("mixtral", "qwen2_moe", "olmoe")
EXPERTS = {"experts": 4, "experts_per_token": 2}
STEPS, LOG_EVERY = 12, 4
# A capacity of the mean load: tokens are dropped, and counted, from the first steps on.
# In fp32: under bf16 a sharded reduction's rounding can move a token across the capacity.
# Where each process counts its own tokens (backend_facts), dropless and the balancing loss
# unweighted: fsdp's processes would drop other tokens than one device, and balance others.
CAPACITY = {"precision": "32-true", "moe": {"capacity_factor": 1.0}}
if not MOE_OVER_THE_GLOBAL_BATCH:
    CAPACITY["moe"] = {"capacity_factor": 0, "router_aux_loss_coef": 0}
OPTIONS = {"seq_len": 16, "dim": 32, "layers": 2, "heads": 4, "kv_heads": 2, "mlp_dim": 64,
           "max_bytes": 30000, **EXPERTS}  # fmt: skip
LOSS_REL = 1e-5
ROUTER_METRICS = {"router_aux_loss", "expert_load_max", "tokens_dropped"}
# Llama 4 (its mixture outside the experts interface, made static by hf/llama4.py): four
# layers, the mixtures (1 and 3, each with its shared expert) between dense ones (0 and 2),
# layer 3 without rotary embeddings (Llama 4's default, every fourth).
LLAMA4 = "llama4_text"
SHAPES: dict[str, dict[str, Any]] = {
    LLAMA4: {"layers": 4, "config_fields": {"interleave_moe_layer_step": 2}},
}
_RUNS: dict[str, dict[str, Any]] = {}  # runs several tests compare against, by request


def guarded_fit(architecture: str, strategy: str, extra: dict[str, Any]) -> dict[str, Any]:
    """Fit with the step guard armed after warm-up; the run's summary (child process)."""
    import tempfile

    from {{ cookiecutter.package_name }}.core import launch
    from {{ cookiecutter.package_name }}.training import build_config, fit, plan_of

    devices = "1" if strategy == "single" else str(MANY_DEVICES)
    with tempfile.TemporaryDirectory() as run_dir:
        config = build_config(
            None,
            {"task": "hf-causal-lm", "accelerator": "cpu", "devices": devices,
             "strategy": strategy, "batch_size": 16 // int(devices), "max_steps": STEPS,
             "log_every": LOG_EVERY, "eval_every": 0, "run_dir": run_dir,
             "task_options": tiny_options(architecture), **extra},
        )  # fmt: skip
        plan = plan_of(config)
        return dict(launch(fit, plan, (config, plan, None, None, 4)))


def tiny_options(architecture: str) -> dict[str, Any]:
    """The task options of the tiny mixture of `architecture`."""
    return {**OPTIONS, **SHAPES.get(architecture, {}), "architecture": architecture}


def run(python_subprocess: Any, architecture: str, strategy: str, **extra: Any) -> dict[str, Any]:
    key = json.dumps([architecture, strategy, extra], sort_keys=True)
    if key not in _RUNS:
        argv = [__file__, architecture, strategy, json.dumps(extra)]
        _RUNS[key] = dict(python_subprocess(argv, env={}))
    return _RUNS[key]


def assert_healthy(summary: dict[str, Any], aux_loss: bool = True) -> None:
    """No transfer beyond the logged losses (router numbers in the same read), the guard
    silent (nothing compiled after warm-up), the router's numbers logged (its aux loss where
    the model defines one)."""
    assert summary["status"] == "completed"
    reads = STEPS // LOG_EVERY + summary["step"]["warmup_reads"]
    assert summary["loop_transfers"] == reads, "a device read outside logging"
    assert summary["diagnosis"] == [] and summary["fallback_ops"] == {}
    guard = summary["guard"]
    assert guard["compilations"] == 0 and guard["transfers"] <= guard["allowed_transfers"]
    metrics = summary["train_metrics"]
    assert set(metrics) == ROUTER_METRICS - (set() if aux_loss else {"router_aux_loss"})
    assert 0 <= metrics["tokens_dropped"] < 1 and metrics["expert_load_max"] >= 1
    assert metrics.get("router_aux_loss", 1.0) > 0


def worst_relative(losses: list[list[float]], reference: list[list[float]]) -> float:
    pairs = zip(losses, reference, strict=True)
    return max(abs(a[1] - b[1]) / abs(b[1]) for a, b in pairs)


def tiny_model(architecture: str) -> Any:
    """The tiny MoE decoder of OPTIONS, built by the example task (plain CPU torch)."""
    from {{ cookiecutter.package_name }}.tasks.hf_causal_lm import make_task

    torch.manual_seed(0)
    return make_task(**tiny_options(architecture)).build_model()


@pytest.fixture(scope="module", params=ARCHITECTURES)
def moe_runs(request: pytest.FixtureRequest, python_subprocess: Any) -> dict[str, Any]:
    """Each mixture's guarded fit on one device and under fsdp, at the mean load's capacity:
    their summaries."""
    return {
        strategy: run(python_subprocess, request.param, strategy, **CAPACITY)
        for strategy in ("single", "fsdp")
    }


@pytest.mark.slow
def test_moe_decoder_trains_and_fsdp_gives_its_losses(moe_runs: dict[str, Any]) -> None:
    """It trains the mixture on one device and under fsdp with no host sync and nothing
    compiled after warm-up, fsdp with the one-device losses."""
    single, sharded = moe_runs["single"], moe_runs["fsdp"]
    assert_healthy(single)
    assert_healthy(sharded)
    assert worst_relative(sharded["train_losses"], single["train_losses"]) <= LOSS_REL
    assert single["train_losses"][-1][1] < single["train_losses"][0][1]
    assert single["parameters"]["active"] < single["parameters"]["total"]
    assert single["train_metrics"]["tokens_dropped"] > 0 or not MOE_OVER_THE_GLOBAL_BATCH


@pytest.mark.slow
@one_graph_per_step_kind
def test_moe_decoder_trains_with_one_graph(moe_runs: dict[str, Any]) -> None:
    """It compiles one train graph on one device and under fsdp."""
    assert [run["loop_compilations"] for run in moe_runs.values()] == [1, 1]


@pytest.fixture(scope="module")
def llama4_runs(python_subprocess: Any) -> dict[str, Any]:
    """Llama 4's guarded fit on one device and under fsdp, at the mean load's capacity."""
    return {
        strategy: run(python_subprocess, LLAMA4, strategy, **CAPACITY)
        for strategy in ("single", "fsdp")
    }


@pytest.mark.slow
def test_llama4_trains_and_fsdp_gives_its_losses(llama4_runs: dict[str, Any]) -> None:
    """It trains Llama 4 through the static experts on one device and under fsdp with no host
    sync and nothing compiled after warm-up, fsdp with the one-device losses, its active
    parameters a token's top-k experts' and no load-balancing loss (it defines none)."""
    single, sharded = llama4_runs["single"], llama4_runs["fsdp"]
    assert_healthy(single, aux_loss=False)
    assert_healthy(sharded, aux_loss=False)
    assert worst_relative(sharded["train_losses"], single["train_losses"]) <= LOSS_REL
    assert single["train_losses"][-1][1] < single["train_losses"][0][1]
    assert single["train_metrics"]["tokens_dropped"] > 0 or not MOE_OVER_THE_GLOBAL_BATCH
    params = dict(tiny_model(LLAMA4).named_parameters())
    experts = sum(p.numel() for name, p in params.items() if ".experts." in name)
    idle = (1 - EXPERTS["experts_per_token"] / EXPERTS["experts"]) * experts
    assert single["parameters"]["active"] == single["parameters"]["total"] - round(idle)


@pytest.mark.slow
@one_graph_per_step_kind
def test_llama4_trains_with_one_graph(llama4_runs: dict[str, Any]) -> None:
    """It compiles one Llama 4 train graph on one device and under fsdp."""
    assert [run["loop_compilations"] for run in llama4_runs.values()] == [1, 1]


def test_llama4_static_experts_equal_transformers_llama4_moe(device: Any) -> None:
    """It gives transformers' own Llama 4 logits, loss and gradients within 1e-5 on the same
    weights (dense and mixture layers, one without rotary embeddings), computing each
    token's top-k experts only, on its input scaled by the router's score."""
    # (The device is in use first: autograd must know it before any backward pass, or a
    # later test's backward on it fails.)
    import copy

    from {{ cookiecutter.package_name }} import hf
    from {{ cookiecutter.package_name }}.hf.moe import MoeSettings, experts_modules, router_metrics

    model = tiny_model(LLAMA4)
    theirs = copy.deepcopy(model)
    hf.prepare(model, MoeSettings(capacity_factor=0.0))
    layers = model.model.layers
    assert [hasattr(layer.feed_forward, "shared_expert") for layer in layers] == [0, 1, 0, 1]
    assert [layer.self_attn.use_rope for layer in layers] == [1, 1, 1, 0]
    assert len(experts_modules(model)) == 2
    tokens = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(1))
    outputs = []
    for each in (model, theirs):
        output = each(input_ids=tokens, labels=tokens, use_cache=False)
        output.loss.backward()
        outputs.append(output)
    ours, eager = outputs

    torch.testing.assert_close(ours.logits, eager.logits, rtol=1e-5, atol=1e-5)
    assert abs(float(ours.loss.detach() - eager.loss.detach())) <= 1e-5
    for (name, grad), (_, reference) in zip(
        ((n, p.grad) for n, p in model.named_parameters()),
        ((n, p.grad) for n, p in theirs.named_parameters()),
        strict=True,
    ):
        torch.testing.assert_close(grad, reference, rtol=1e-5, atol=1e-6, msg=name)
    assert float(router_metrics(model)["tokens_dropped"]) == 0.0
{%- if cookiecutter.backend == "torch_xla" %}


# torch_xla only: the `expert` mesh axis (torch_tpu offers data, fsdp and tensor).
@pytest.mark.slow
def test_expert_axis_holds_a_share_of_the_experts_and_gives_the_one_device_losses(
    python_subprocess: Any,
) -> None:
    """It splits the experts over `expert=4` (and fsdp=2), with the one-device losses."""
    single = run(python_subprocess, "mixtral", "single", **CAPACITY)
    split = run(python_subprocess, "mixtral", "fsdp", mesh="fsdp=2,expert=4", **CAPACITY)

    assert_healthy(split)
    assert worst_relative(split["train_losses"], single["train_losses"]) <= LOSS_REL
    assert split["train_metrics"] == pytest.approx(single["train_metrics"], rel=1e-4)
    model = tiny_model("mixtral")
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n) * 4
    rest = sum(p.numel() for n, p in model.named_parameters() if ".experts." not in n) * 4
    # Each device: a quarter of the experts (expert=4), halved again by fsdp=2 like the rest.
    assert split["memory"]["param_bytes_per_device"] == experts // 4 // 2 + rest // 2
    assert single["memory"]["param_bytes_total"] == experts + rest


@pytest.mark.slow
def test_llama4_expert_axis_gives_the_one_device_losses(python_subprocess: Any) -> None:
    """It splits Llama 4's experts over `expert=4` (and fsdp=2), with the one-device losses."""
    single = run(python_subprocess, LLAMA4, "single", **CAPACITY)
    split = run(python_subprocess, LLAMA4, "fsdp", mesh="fsdp=2,expert=4", **CAPACITY)

    assert_healthy(split, aux_loss=False)
    assert worst_relative(split["train_losses"], single["train_losses"]) <= LOSS_REL
    params = dict(tiny_model(LLAMA4).named_parameters())
    experts = sum(p.numel() for name, p in params.items() if ".experts." in name) * 4
    rest = sum(p.numel() for name, p in params.items() if ".experts." not in name) * 4
    # Each device: a quarter of the experts (expert=4), halved again by fsdp=2 like the rest.
    assert split["memory"]["param_bytes_per_device"] == experts // 4 // 2 + rest // 2
    assert single["memory"]["param_bytes_total"] == experts + rest
{%- endif %}


def test_llama4_attends_within_documents_and_chunks_through_the_projects_attention() -> None:
    """It gives Llama 4 the project's attention (flash on TPU) with transformers' own logits,
    its rotary layers attending within chunks of attention_chunk_size tokens, a padded row's
    chunks counted from its first token, and each packed document the logits it has alone."""
    import copy

    from {{ cookiecutter.package_name }} import hf
    from {{ cookiecutter.package_name }}.hf.attention import NAME
    from {{ cookiecutter.package_name }}.hf.moe import MoeSettings
    from {{ cookiecutter.package_name }}.tasks.hf_causal_lm import make_task

    fields = {**SHAPES[LLAMA4]["config_fields"], "attention_chunk_size": 4}
    torch.manual_seed(0)
    task = make_task(**{**tiny_options(LLAMA4), "config_fields": fields})
    model = hf.prepare(task.build_model(), MoeSettings(capacity_factor=0.0)).eval()
    assert model.config._attn_implementation == NAME
    assert model.config.layer_types.count("chunked_attention") == 3
    reference = copy.deepcopy(model)
    reference.set_attn_implementation("sdpa")  # transformers' own attention and chunked masks
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(5))
    positions = torch.cat([torch.arange(6), torch.arange(10)]).repeat(2, 1)  # 6 + 10 tokens
    padding = torch.ones(2, 16, dtype=torch.long)
    padding[1, :3] = 0  # the second row starts after 3 padded tokens
    with torch.no_grad():
        for given in ({}, {"attention_mask": padding}):
            ours, theirs = (m(input_ids=tokens, **given).logits for m in (model, reference))
            valid = padding.bool() if given else slice(None)
            torch.testing.assert_close(ours[valid], theirs[valid], rtol=1e-5, atol=1e-5)
        # Packed: each document chunked from its own start (transformers 5.20 chunks the row).
        packed = model(input_ids=tokens, position_ids=positions).logits
        alone = [reference(input_ids=tokens[:, a:b]).logits for a, b in ((0, 6), (6, 16))]
        torch.testing.assert_close(packed, torch.cat(alone, 1), rtol=1e-5, atol=1e-5)
        whole = reference.model.config.attention_chunk_size
        reference.config.attention_chunk_size = 64  # one chunk: plain causal
        unchunked = reference(input_ids=tokens).logits
        reference.config.attention_chunk_size = whole
    assert (unchunked - model(input_ids=tokens).logits).abs().max() > 1e-3


def test_llama4_expert_axis_splits_its_experts_without_a_plan_in_its_config() -> None:
    """It splits Llama 4's stacked expert weights over `expert` from the static experts' own
    plan where transformers' config has none (transformers 5.24 dropped it)."""
    from {{ cookiecutter.package_name }} import hf
    from {{ cookiecutter.package_name }}.hf.expert_parallel import expert_parallel_rules

    model = hf.prepare(tiny_model(LLAMA4))
    model.config.base_model_ep_plan = None
    rules = expert_parallel_rules(model, 4)

    split = {name for name, _ in model.named_parameters() if any(r.matches(name) for r in rules)}
    assert split == {f"model.layers.{i}.feed_forward.experts.{weight}"
                     for i in (1, 3) for weight in ("gate_up_proj", "down_proj")}  # fmt: skip
    assert {rule.spec[0] for rule in rules} == {"expert"}


def test_llama4_lora_leaves_its_router_out_of_all_linear_and_refuses_it_by_name(
    device: Any,
) -> None:
    """It puts `all-linear` adapters on Llama 4's attention and shared experts, not on its
    router (a Linear whose forward returns its scores and logits), trains them, and refuses
    the router named as a target in one line."""
    # (The device in use first, as above.)
    from {{ cookiecutter.package_name }} import hf
    from {{ cookiecutter.package_name }}.hf import HFConfigError
    from {{ cookiecutter.package_name }}.hf.lora import LoraSettings, apply_lora

    model = apply_lora(hf.prepare(tiny_model(LLAMA4)), LoraSettings(rank=4), "32-true")
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(4))
    model(input_ids=tokens, labels=tokens).loss.backward()

    adapted = {name.split(".lora_")[0] for name, p in model.named_parameters() if "lora_" in name}
    assert any(".shared_expert." in name for name in adapted)
    assert any(".self_attn." in name for name in adapted)
    assert not any(".router" in name for name in adapted)
    trained = [p for name, p in model.named_parameters() if "lora_B" in name]
    assert trained and all(p.grad is not None for p in trained)
    router = LoraSettings(target_modules=("router",))
    with pytest.raises(HFConfigError, match="names Llama4Router, a router whose forward"):
        apply_lora(hf.prepare(tiny_model(LLAMA4)), router, "32-true")


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_dropless_experts_equal_transformers_eager_experts(architecture: str) -> None:
    """It gives transformers' own `eager` experts' logits, loss and aux loss within 1e-5."""
    from {{ cookiecutter.package_name }} import hf
    from {{ cookiecutter.package_name }}.hf.moe import MoeSettings

    model = tiny_model(architecture)
    tokens = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(1))
    model.set_experts_implementation("eager")
    with torch.no_grad():
        eager = model(input_ids=tokens, labels=tokens, output_router_logits=True)
        hf.prepare(model, MoeSettings(capacity_factor=0.0))
        ours = model(input_ids=tokens, labels=tokens, output_router_logits=True)

    assert model.config._experts_implementation == "xla"
    torch.testing.assert_close(ours.logits, eager.logits, rtol=1e-5, atol=1e-5)
    assert abs(float(ours.loss - eager.loss)) <= 1e-5
    assert abs(float(ours.aux_loss - eager.aux_loss)) <= 1e-5


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_lora_on_experts_counts_a_tokens_share_of_their_adapters_and_warns_nothing(
    architecture: str,
) -> None:
    """It counts, as active per token, the top-k share of the experts' adapters as of the
    experts (peft splits their rank over the experts), and wraps without peft's warning that
    the experts' rank patterns were ignored (they were applied)."""
    import warnings

    from {{ cookiecutter.package_name }}.hf.lora import LoraSettings, apply_lora
    from {{ cookiecutter.package_name }}.training.model import parameter_counts

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = apply_lora(tiny_model(architecture), LoraSettings(rank=4), "32-true")
    assert not [str(w.message) for w in caught if "pattern" in str(w.message)]
    params = dict(model.named_parameters())
    adapters = [name for name in params if ".experts." in name and "lora_" in name]
    # peft's all-linear reaches Mixtral's and OLMoE's stacked experts, not Qwen2-MoE's.
    assert adapters or architecture == "qwen2_moe", "peft put no adapters on the experts"
    expert_elements = sum(p.numel() for name, p in params.items() if ".experts." in name)
    idle = (1 - EXPERTS["experts_per_token"] / EXPERTS["experts"]) * expert_elements
    counts = parameter_counts(model)
    assert counts["active"] == counts["total"] - round(idle)


def test_tokens_over_capacity_skip_their_expert_and_are_counted() -> None:
    """It drops the pairs over an expert's capacity, later tokens first, and counts them."""
    from {{ cookiecutter.package_name }}.hf.experts import LOADS, SETTINGS, Routing, xla_experts

    experts = tiny_model("mixtral").model.layers[0].mlp.experts
    setattr(experts, SETTINGS, Routing(capacity_factor=1.0))
    tokens, hidden = 8, 32
    states = torch.randn(tokens, hidden)
    # Every token to experts 0 and 1: each takes ceil(1.0 x 16 / 4) = 4 of its 8 tokens.
    index = torch.tensor([[0, 1]] * tokens)
    weights = torch.full((tokens, 2), 0.5)
    out = xla_experts(experts, states, index, weights)
    loads, kept = getattr(experts, LOADS)
    dropless = xla_experts_dropless(experts, states, index, weights)

    assert loads.tolist() == [8, 8, 0, 0] and int(kept) == 8
    torch.testing.assert_close(out[:4], dropless[:4])  # the first four fit
    assert torch.equal(out[4:], torch.zeros(4, hidden))  # the rest pass by (the residual)


def xla_experts_dropless(experts: Any, *args: torch.Tensor) -> torch.Tensor:
    from {{ cookiecutter.package_name }}.hf.experts import SETTINGS, Routing, xla_experts

    saved = getattr(experts, SETTINGS)
    setattr(experts, SETTINGS, Routing(capacity_factor=0.0))
    try:
        return xla_experts(experts, *args)
    finally:
        setattr(experts, SETTINGS, saved)


def test_router_aux_loss_is_part_of_the_training_loss() -> None:
    """It trains on next-token loss + the config's (or [moe]'s) coefficient x the aux loss."""
    import torch.nn.functional as F
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    from {{ cookiecutter.package_name }} import hf
    from {{ cookiecutter.package_name }}.hf.moe import MoeSettings
    from {{ cookiecutter.package_name }}.tasks.hf_causal_lm import make_task

    task = make_task(**{**OPTIONS, "architecture": "mixtral"})
    tokens = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(2))
    batch = {"x": tokens[:, :-1], "y": tokens[:, 1:]}
    for coef in (None, 0.5):
        torch.manual_seed(0)
        model = hf.prepare(task.build_model(), MoeSettings(router_aux_loss_coef=coef))
        loss = task.loss(model, batch).detach()
        plain = model(input_ids=batch["x"], output_router_logits=True)
        next_token = F.cross_entropy(plain.logits.flatten(0, 1), batch["y"].flatten()).detach()
        aux = load_balancing_loss_func(plain.router_logits, 4, 2).detach()
        expected = coef if coef is not None else model.config.router_aux_loss_coef
        assert float(aux) > 0.5 and float(loss - next_token) > 0
        assert abs(float(loss - (next_token + expected * aux))) <= 1e-5


@pytest.mark.parametrize("architecture", ["mixtral", LLAMA4])
def test_flops_count_the_active_experts_not_all_of_them(device: Any, architecture: str) -> None:
    """It counts a token's top-k experts: 8 experts cost what 4 do, at many more parameters
    (Llama 4's too, which transformers runs over all of them)."""
    # (As in a run, the device is in use first: autograd must know it before any backward
    # pass, the meta one included.)
    from {{ cookiecutter.package_name }}.tasks.hf_causal_lm import make_task
    from {{ cookiecutter.package_name }}.training.throughput import count_flops

    def flops_and_parameters(experts: int) -> tuple[int, int]:
        task = make_task(**{**tiny_options(architecture), "experts": experts})
        sample = {"x": torch.zeros(8, 16, dtype=torch.long), "y": torch.zeros(8, 16).long()}
        flops = count_flops(task, sample)
        assert flops is not None
        return flops, sum(p.numel() for p in task.build_model().parameters())

    four, eight = flops_and_parameters(4), flops_and_parameters(8)
    assert eight[1] > 1.4 * four[1]
    assert math.isclose(eight[0], four[0], rel_tol=0.02)  # the router's few more columns


@pytest.mark.slow
def test_moe_lora_on_attention_trains_and_exports_what_transformers_generates_with(
    tmp_path: Path, python_subprocess: Any
) -> None:
    """It trains LoRA on a mixture's attention (one graph where the backend compiles one per
    step kind), and exports a merged model that plain transformers loads, with the run's
    logits, and generates with."""
    from training_helpers import cli, write_config

    lora = {"rank": 4, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    config = write_config(
        tmp_path, task_options={**OPTIONS, "architecture": "mixtral"}, max_steps=8,
        log_every=4, lora=lora, moe={"capacity_factor": 0},
    )  # fmt: skip
    run_dir, out = tmp_path / "run", tmp_path / "hf"
    trained = cli("train", "--config", str(config), "--run-dir", str(run_dir),
                  "--devices", "1", "--strategy", "single")  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["diagnosis"] == []
    assert summary["loop_compilations"] == 1 or not ONE_GRAPH_PER_STEP_KIND
    assert summary["parameters"]["trainable"] < summary["parameters"]["total"] / 10
    assert "tokens_dropped=0.0000" in trained.stdout  # dropless: printed with the loss
    assert set(summary["train_metrics"]) == ROUTER_METRICS  # the aux loss through peft too
    checkpoint = str(run_dir / "checkpoints")
    exported = cli("export", "--checkpoint", checkpoint, "--out", str(out), "--format", "hf")
    assert exported.returncode == 0, exported.stderr[-3000:]
    saved = json.loads((out / "config.json").read_text())
    assert "experts_implementation" not in str(saved) and not saved["output_router_logits"]

    ours = python_subprocess([__file__, "checkpoint", checkpoint])
    theirs = python_subprocess([__file__, "transformers", str(out)], env={"PJRT_DEVICE": ""})

    torch.testing.assert_close(
        torch.tensor(theirs["logits"]), torch.tensor(ours["logits"]), rtol=1e-4, atol=1e-4
    )
    assert theirs["torch_xla_loaded"] is False and theirs["new_tokens"] == 8


def fixed_tokens() -> torch.Tensor:
    return torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(3))


def logits_of_checkpoint(location: str) -> dict[str, Any]:
    """The run's model (its base, adapters, experts settings) on one device, in fp32."""
    from {{ cookiecutter.package_name }}.core import launch
    from {{ cookiecutter.package_name }}.tasks import load_task
    from {{ cookiecutter.package_name }}.training import build_config, plan_of
    from {{ cookiecutter.package_name }}.training.checkpoint import load_weights, read_config
    from {{ cookiecutter.package_name }}.training.model import build, read_over

    _, saved = read_config(location)
    one_device = {"devices": "1", "strategy": "single", "mesh": "", "precision": "32-true"}
    config = build_config(None, {**saved, **one_device})
    plan = plan_of(config)

    def logits(config: Any, plan: Any) -> dict[str, Any]:
        # As the run built it: a LoRA checkpoint holds its adapters, the base comes from here.
        built = build(load_task(config.task, options=config.task_options), config)
        model, _ = plan.strategy.setup_model(built.model, source=read_over(built))
        load_weights(location, plan.strategy, model)
        device = next(model.parameters()).device
        with torch.no_grad():
            logits = model.eval()(input_ids=fixed_tokens().to(device)).logits
        return {"logits": logits.cpu().tolist()}

    return dict(launch(logits, plan, (config, plan)))


def generate_with_transformers(folder: str) -> dict[str, Any]:
    """The export in plain transformers (torch_xla unimportable): logits, and 8 new tokens."""
    sys.modules["torch_xla"] = None  # type: ignore[assignment]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = model(input_ids=fixed_tokens()).logits
        prompt = fixed_tokens()[:1, :4]
        generated = model.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    return {
        "logits": logits.tolist(),
        "new_tokens": generated.shape[1] - prompt.shape[1],
        "torch_xla_loaded": sys.modules.get("torch_xla") is not None,
    }


REFUSED = {
    "experts-outside-the-interface": (
        {"architecture": "jetmoe", "experts": 0, "experts_per_token": 0}, "",
        "error: JetMoeForCausalLM computes its experts outside transformers' experts interface",
    ),
{%- if cookiecutter.backend == "torch_tpu" %}
    "expert-axis": (
        {}, "fsdp=2,expert=4", "error: mesh axis 'expert' is not offered by the torch_tpu backend"
    ),
{%- else %}
    "expert-axis-vs-experts": (
        {"experts": 6}, "fsdp=2,expert=4", "error: expert=4 does not divide the model's 6 experts"
    ),
    "expert-axis-on-a-dense-model": (
        {"architecture": "llama", "experts": 0, "experts_per_token": 0}, "fsdp=2,expert=4",
        "error: a 'llama' model has no expert-parallel plan in transformers",
    ),
{%- endif %}
    "expert-target-for-lora": (
        {"lora": "experts"}, "", "error: lora.target_modules 'experts' names MixtralExperts's"
    ),
    "aux-loss-weight-for-llama4": (
        {"architecture": LLAMA4, "moe": {"router_aux_loss_coef": 0.01}}, "",
        "error: moe.router_aux_loss_coef = 0.01: transformers' Llama 4 defines no "
        "load-balancing loss",
    ),
}  # fmt: skip


@pytest.mark.parametrize("options,mesh,start", REFUSED.values(), ids=REFUSED)
def test_what_a_mixture_cannot_run_is_refused_in_one_line(
    options: dict[str, Any], mesh: str, start: str, tmp_path: Path
) -> None:
    """It refuses foreign experts, an expert axis that does not fit, expert LoRA targets, and
    a load-balancing loss's weight for a model that defines none."""
    from training_helpers import cli, write_config

    options = {**OPTIONS, "architecture": "mixtral", **options}
    lora, moe = options.pop("lora", None), options.pop("moe", None)
    tables = {"lora": {"target_modules": [lora]}} if lora else {}
    config = write_config(tmp_path, task_options=options, **tables, **({"moe": moe} if moe else {}))
    where = ["--devices", "8", "--strategy", "fsdp", "--mesh", mesh] if mesh else []
    result = cli("train", "--config", str(config), "--run-dir", str(tmp_path / "run"), *where)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith(start), lines


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    if sys.argv[1] == "checkpoint":
        print(json.dumps(logits_of_checkpoint(sys.argv[2])))
    elif sys.argv[1] == "transformers":
        print(json.dumps(generate_with_transformers(sys.argv[2])))
    else:
        print(json.dumps(guarded_fit(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))))
