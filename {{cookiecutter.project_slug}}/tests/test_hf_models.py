"""Any transformers decoder trains at the backend's speed: no device read in the step, nothing
compiled after warm-up, and fsdp giving the one-device losses, with each model's own forward."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from backend_facts import MANY_DEVICES, one_graph_per_step_kind

pytestmark = pytest.mark.hf

ARCHITECTURES = ("llama", "qwen2", "gemma")
STRATEGIES = ("single", "fsdp")
STEPS, LOG_EVERY = 12, 4
# A size no other test trains, so each graph compiles here, in this process.
OPTIONS = {"seq_len": 24, "dim": 32, "layers": 2, "heads": 4, "kv_heads": 2, "max_bytes": 30000}
{%- if cookiecutter.precision == "32-true" %}
LOSS_REL = 1e-5
{%- else %}
LOSS_REL = 5e-3  # the baked default precision is bf16: roundings differ with the layout
{%- endif %}


def guarded_fit(architecture: str, strategy: str, extra: dict[str, Any]) -> dict[str, Any]:
    """Fit with the step guard armed after warm-up; the run's summary (child process)."""
    import tempfile

    from {{ cookiecutter.package_name }}.core import launch
    from {{ cookiecutter.package_name }}.training import build_config, fit, plan_of

    devices = str(MANY_DEVICES) if strategy == "fsdp" else "1"
    with tempfile.TemporaryDirectory() as run_dir:
        config = build_config(
            None,
            {"task": "hf-causal-lm", "accelerator": "cpu", "devices": devices,
             "strategy": strategy, "batch_size": 16 // int(devices), "max_steps": STEPS,
             "log_every": LOG_EVERY, "eval_every": 0, "run_dir": run_dir,
             "task_options": {**OPTIONS, "architecture": architecture}, **extra},
        )  # fmt: skip
        plan = plan_of(config)
        return dict(launch(fit, plan, (config, plan, None, None, 4)))


def run(python_subprocess: Any, architecture: str, strategy: str, **extra: Any) -> dict[str, Any]:
    return dict(python_subprocess([__file__, architecture, strategy, json.dumps(extra)], env={}))


def assert_healthy(summary: dict[str, Any]) -> None:
    """No transfer beyond the logged losses, the guard silent: nothing compiled after warm-up."""
    assert summary["status"] == "completed"
    reads = STEPS // LOG_EVERY + summary["step"]["warmup_reads"]
    assert summary["loop_transfers"] == reads, "a device read outside logging"
    assert summary["diagnosis"] == [] and summary["fallback_ops"] == {}
    guard = summary["guard"]
    assert guard["compilations"] == 0 and guard["transfers"] <= guard["allowed_transfers"]


def worst_relative(losses: list[list[float]], reference: list[list[float]]) -> float:
    pairs = zip(losses, reference, strict=True)
    return max(abs(a[1] - b[1]) / abs(b[1]) for a, b in pairs)


@pytest.fixture(scope="module", params=ARCHITECTURES)
def decoder_runs(request: pytest.FixtureRequest, python_subprocess: Any) -> dict[str, Any]:
    """Each decoder's guarded fit on one device and under fsdp: their summaries."""
    return {strategy: run(python_subprocess, request.param, strategy) for strategy in STRATEGIES}


@pytest.mark.slow
def test_decoder_trains_and_fsdp_gives_its_losses(decoder_runs: dict[str, Any]) -> None:
    """It trains the decoder on one device and under fsdp with no host sync and nothing
    compiled after warm-up, fsdp with the one-device losses on a share of the memory."""
    single, sharded = decoder_runs["single"], decoder_runs["fsdp"]
    assert_healthy(single)
    assert_healthy(sharded)
    share = single["memory"]["param_bytes_total"] / MANY_DEVICES
    assert sharded["memory"]["param_bytes_per_device"] < 2 * share
    assert worst_relative(sharded["train_losses"], single["train_losses"]) <= LOSS_REL
    assert single["train_losses"][-1][1] < single["train_losses"][0][1]


@pytest.mark.slow
@one_graph_per_step_kind
def test_decoder_trains_with_one_graph(decoder_runs: dict[str, Any]) -> None:
    """It compiles one train graph on one device and under fsdp."""
    assert [run["loop_compilations"] for run in decoder_runs.values()] == [1, 1]
{%- if cookiecutter.backend == "torch_tpu" %}


# Over a tensor axis: fsdp x tensor as 4 processes (test_distributed.py trains the example's
# model that way too).
MESHES = {"fsdp=2,tensor=2": 4}
{%- else %}


# Over a tensor axis, and over data replicas of it, on 8 XLA:CPU devices.
MESHES = {"fsdp=4,tensor=2": 8, "data=2,fsdp=2,tensor=2": 8}
{%- endif %}


@pytest.mark.slow
@pytest.mark.parametrize("mesh", list(MESHES))
def test_decoder_shards_two_ways_from_its_own_tensor_parallel_plan(
    mesh: str, python_subprocess: Any
) -> None:
    """It splits the plan's projections over `tensor` and gives the one-device losses."""
    devices = MESHES[mesh]
    tensor = int(mesh.rpartition("tensor=")[2])
    single = run(python_subprocess, "llama", "single", precision="32-true")
    # batch_size is per device of the data axes: a tensor group shares its samples.
    sharded = run(
        python_subprocess, "llama", "fsdp", precision="32-true", mesh=mesh, devices=str(devices),
        batch_size=16 * tensor // devices,
    )  # fmt: skip
    assert sharded["global_batch"] == single["global_batch"] == 16

    assert_healthy(sharded)
    assert worst_relative(sharded["train_losses"], single["train_losses"]) <= 1e-5
    replicas = 2 if mesh.startswith("data") else 1
    memory = sharded["memory"]
    assert memory["state_bytes_per_device"] < 1.6 * memory["state_bytes_total"] * replicas / devices


def test_tensor_axis_must_divide_the_heads(tmp_path: Path) -> None:
    """It refuses a tensor axis that splits attention heads, in one line, exit 2."""
    from training_helpers import cli, write_config

    config = write_config(tmp_path, task_options={**OPTIONS, "heads": 4, "kv_heads": 2})
    result = cli("train", "--config", str(config), "--run-dir", str(tmp_path / "run"),
                 "--devices", "4", "--strategy", "fsdp", "--mesh", "fsdp=1,tensor=4")  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: tensor=4 does not divide the model's 2 heads"), lines


@pytest.mark.slow
def test_decoder_under_bf16_mixed_and_activation_checkpointing_stays_healthy(
    python_subprocess: Any,
) -> None:
    """It keeps no host sync and nothing compiled after warm-up with autocast and recomputed
    decoder layers."""
    summary = run(
        python_subprocess, "llama", "fsdp", precision="bf16-mixed", activation_checkpointing=True
    )
    assert_healthy(summary)
    assert summary["precision"] == "bf16-mixed"


def test_mask_checks_read_nothing_from_the_device(device: Any, compiled: Any) -> None:
    """It builds masks with and without a padding mask without a device-to-host transfer."""
    from {{ cookiecutter.package_name }}.core import ops
    from {{ cookiecutter.package_name }}.core.health import transfer_count
    from {{ cookiecutter.package_name }}.hf import prepare
    from {{ cookiecutter.package_name }}.tasks.hf_causal_lm import make_task

    task = make_task(**{**OPTIONS, "architecture": "qwen2", "max_bytes": 4000})
    model = compiled(prepare(task.build_model()).to(device))
    tokens = torch.randint(0, 256, (2, 8)).to(device)
    padding = torch.ones(2, 8, dtype=torch.long).to(device)
    ops.sync()

    before = transfer_count()
    for kwargs in ({}, {"attention_mask": padding}):
        model(input_ids=tokens, **kwargs).logits.sum()
    ops.sync()

    assert transfer_count() == before
{%- if cookiecutter.backend == "torch_xla" %}


# torch_xla only: the fix is for its lazy tensors (under torch.compile transformers skips the
# checks by itself).
def test_mask_checks_read_the_device_without_the_fix(device: Any) -> None:
    """It shows the read the fix removes: transformers' packed-sequence check on XLA."""
    import torch_xla
    from transformers import masking_utils

    from {{ cookiecutter.package_name }}.core.health import transfer_count
    from {{ cookiecutter.package_name }}.hf.masks import static_masks

    static_masks()
    positions = torch.arange(8).expand(2, -1).to(device)
    torch_xla.sync()
    fixed_at = transfer_count()
    fixed = masking_utils.find_packed_sequence_indices(positions)
    torch_xla.sync()
    reads_fixed = transfer_count() - fixed_at

    patched = masking_utils.is_tracing
    masking_utils.is_tracing = patched.__wrapped__  # transformers' own check, for a moment
    try:
        plain_at = transfer_count()
        plain = masking_utils.find_packed_sequence_indices(positions)
        reads_plain = transfer_count() - plain_at
    finally:
        masking_utils.is_tracing = patched

    assert (reads_fixed, reads_plain) == (0, 1)
    assert plain is None and torch.equal(fixed.cpu(), torch.zeros(2, 8, dtype=fixed.dtype))
{%- endif %}


def test_causal_decoders_run_the_projects_attention_and_windowed_ones_keep_sdpa() -> None:
    """It gives plain causal decoders the project's attention (flash on TPU) and leaves
    sliding-window ones on transformers' SDPA, whose masks honour windows and documents."""
    from {{ cookiecutter.package_name }}.hf import prepare as prepare_model
    from {{ cookiecutter.package_name }}.hf.attention import NAME
    from {{ cookiecutter.package_name }}.tasks.hf_causal_lm import make_task

    chosen = {}
    for architecture, extra in (("llama", {}), ("qwen2", {}), ("gemma2", {}), ("mistral", {})):
        task = make_task(**{**OPTIONS, "architecture": architecture, "max_bytes": 4000}, **extra)
        if architecture == "mistral":
            task.config.sliding_window = 8
        chosen[architecture] = prepare_model(task.build_model()).config._attn_implementation
    # Gemma2 keeps transformers' own too: SDPA, or eager where transformers (5.24 on) refuses
    # SDPA for its soft-capped logits.
    assert chosen.pop("gemma2") in ("sdpa", "eager")
    assert chosen == {"llama": NAME, "qwen2": NAME, "mistral": "sdpa"}


def test_a_forward_given_no_positions_attends_causally_without_a_document_mask(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It builds no document mask for a forward given no positions (one document a row),
    one per layer for a forward given them, and forgets them at the next forward."""
    from {{ cookiecutter.package_name }}.core import attention as core_attention
    from {{ cookiecutter.package_name }}.hf import prepare as prepare_model
    from {{ cookiecutter.package_name }}.tasks.hf_causal_lm import make_task

    built: list[int] = []
    real = core_attention.document_mask

    def counted(segments: torch.Tensor) -> torch.Tensor:
        built.append(1)
        return real(segments)

    monkeypatch.setattr(core_attention, "document_mask", counted)
    task = make_task(**{**OPTIONS, "max_bytes": 4000})
    torch.manual_seed(0)
    model = prepare_model(task.build_model()).eval()
    x = torch.randint(0, 250, (2, 16))
    positions = torch.arange(16).repeat(2, 1)
    positions[:, 8:] -= 8  # two documents in each row
    with torch.no_grad():
        alone = model(input_ids=x).logits
        assert built == []
        packed = model(x, None, positions).logits  # positions given by place, not by name
        assert len(built) == OPTIONS["layers"]
        again = model(input_ids=x, position_ids=None).logits
    assert len(built) == OPTIONS["layers"]
    assert torch.equal(alone, again)
    assert torch.allclose(packed[:, :8], alone[:, :8], atol=1e-5)
    assert (packed[:, 8:] - alone[:, 8:]).abs().max() > 1e-3  # the second documents, alone


def test_packed_documents_have_the_losses_they_have_alone(
    tmp_path: Path, device: Any, compiled: Any
) -> None:
    """It gives each document of a packed window its losses alone (Llama), in one graph with
    no host read, through the project's attention and through transformers' SDPA masks."""
    import copy

    import torch.nn.functional as F

    from {{ cookiecutter.package_name }}.core import health, ops
    from {{ cookiecutter.package_name }}.data.encoding import Tokenizer
    from {{ cookiecutter.package_name }}.data.prepare import Settings, prepare
    from {{ cookiecutter.package_name }}.hf import prepare as prepare_model
    from {{ cookiecutter.package_name }}.hf.attention import NAME
    from {{ cookiecutter.package_name }}.tasks.hf_causal_lm import make_task

    from data_helpers import document_spans, short_documents_jsonl, window_with_documents

    def losses(model: Any, x: torch.Tensor, y: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        logits = model(input_ids=x, **kwargs).logits
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none")

    out = tmp_path / "prepared"
    settings = Settings(128, eval_fraction=0.1)
    prepare([str(short_documents_jsonl(tmp_path))], str(out), Tokenizer(None), 256, settings)
    task = make_task(str(out), **{**OPTIONS, "seq_len": 128})
    sample = window_with_documents(task.train_dataset())
    torch.manual_seed(0)
    model = prepare_model(task.build_model()).eval()
    assert model.config._attn_implementation == NAME
    reference = copy.deepcopy(model)
    reference.set_attn_implementation("sdpa")  # transformers' own attention and masks
    spans = document_spans(sample["positions"])
    x, y, positions = (sample[key][None] for key in ("x", "y", "positions"))
    with torch.no_grad():  # each document alone, eager on the CPU
        alone = [losses(reference, x[:, a:b], y[:, a:b]) for a, b in spans]
        unmasked = losses(reference, x, y)
        packed = {}
        for name, chosen in (("project", model), ("transformers", reference)):
            on_device = compiled(copy.deepcopy(chosen).to(device))
            inputs = [tensor.to(device) for tensor in (x, y, positions)]
            ops.sync()
            before = health.snapshot()
            found = losses(on_device, inputs[0], inputs[1], position_ids=inputs[2])
            ops.sync()
            counted = health.snapshot().since(before)
            assert (counted.compilations, counted.transfers) == (1, 0), (name, counted)
            packed[name] = found.cpu()

    assert len(spans) >= 4
    for name, found in packed.items():
        for (start, end), expected in zip(spans, alone, strict=True):
            assert torch.allclose(found[start:end], expected, rtol=0, atol=1e-5), (name, start)
    for (start, end), expected in zip(spans[1:], alone[1:], strict=True):
        assert (unmasked[start:end] - expected).abs().max() > 1e-3, (start, end)


@pytest.fixture(scope="module")
def doc_task_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """docs/your-model.md's own transformers task trained under fsdp with LoRA: its summary."""
    import re
    import shutil
    import subprocess

    from training_helpers import cli_env

    project = Path(__file__).resolve().parents[1]
    doc = (project / "docs" / "your-model.md").read_text().split("## 8. A Hugging Face model")[1]
    (snippet,) = re.findall(r"```python\n(.*?)```", doc, flags=re.S)[:1]
    tmp_path = tmp_path_factory.mktemp("doc-task")
    shutil.copytree(project / "src", tmp_path / "src")
    package = "{{ cookiecutter.package_name }}"
    (tmp_path / "src" / package / "tasks" / "my_decoder.py").write_text(snippet)
    command = [sys.executable, "-m", package, "train", "--set", "task=my-decoder",
               "--accelerator", "cpu", "--devices", str(MANY_DEVICES), "--strategy", "fsdp",
               "--set", "lora.rank=8", "--batch-size", str(16 // MANY_DEVICES),
               "--max-steps", str(STEPS),
               "--log-every", str(LOG_EVERY), "--run-dir", "run"]  # fmt: skip
    env = {**cli_env(), "PYTHONPATH": str(tmp_path / "src")}
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads((tmp_path / "run" / "summary.json").read_text()))


@pytest.mark.slow
def test_doc_hugging_face_task_trains_under_fsdp_with_lora(doc_task_run: dict[str, Any]) -> None:
    """It trains docs/your-model.md's own transformers task under fsdp with LoRA: no host
    read beyond the logged losses, a few percent trained, ties kept, the base sharded."""
    summary = doc_task_run
    assert summary["diagnosis"] == [], summary["diagnosis"]
    assert summary["loop_transfers"] == STEPS // LOG_EVERY + summary["step"]["warmup_reads"]
    assert summary["parameters"]["trainable"] < summary["parameters"]["total"] / 5
    assert summary["tied_parameters"]["groups"] == [
        ["base_model.model.model.embed_tokens.weight", "base_model.model.lm_head.weight"]
    ]
    memory = summary["memory"]
    assert memory["param_bytes_per_device"] < 2 * memory["param_bytes_total"] / MANY_DEVICES


@pytest.mark.slow
@one_graph_per_step_kind
def test_doc_hugging_face_task_compiles_one_graph(doc_task_run: dict[str, Any]) -> None:
    """It compiles one train graph for the doc's task under fsdp with LoRA."""
    assert doc_task_run["loop_compilations"] == 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    summary = guarded_fit(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
    print(json.dumps(summary))
