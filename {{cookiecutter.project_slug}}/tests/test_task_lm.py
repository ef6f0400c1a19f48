"""The character language model learns: well below the unigram baseline, ties intact, each
packed document read alone, and long sequences split over a `context` axis."""

from __future__ import annotations

import copy
import json
{% if cookiecutter.backend == "torch_xla" -%}
import re
{% endif -%}
from pathlib import Path
from typing import Any

{% if cookiecutter.backend == "torch_xla" -%}
import pytest
{% endif -%}
import torch
import torch.nn.functional as F

from {{ cookiecutter.package_name }}.core import health, ops
from {{ cookiecutter.package_name }}.data.encoding import Tokenizer
from {{ cookiecutter.package_name }}.data.prepare import Settings, prepare
from {{ cookiecutter.package_name }}.tasks import load_task

from data_helpers import document_spans, short_documents_jsonl, window_with_documents
from training_helpers import cli{% if cookiecutter.backend == "torch_xla" %}, write_config{% endif %}

# Windows of 128 bytes, each holding several short documents.
DOCUMENTS = {"seq_len": 128, "dim": 32, "layers": 2, "heads": 2}


def test_lm_keeps_embeddings_tied() -> None:
    """It ties the output projection to the input embedding."""
    model = load_task("lm", options={"max_bytes": 20000}).build_model()
    assert model.head.weight is model.embed.weight


def test_lm_beats_unigram_baseline(tmp_path: Path) -> None:
    """It trains to an eval loss well below the best context-free model."""
    run_dir = tmp_path / "run"
    result = cli(
        "train", "--accelerator", "cpu", "--max-steps", "150", "--log-every", "50",
        "--run-dir", str(run_dir), "--set", "batch_size=16",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = summary["eval"]
    assert metrics["loss"] < metrics["baseline"] - 0.5, metrics
    assert summary["train_losses"][-1][1] < summary["train_losses"][0][1]


def per_token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")


def test_packed_documents_have_the_losses_they_have_alone(
    tmp_path: Path, device: Any, compiled: Any
) -> None:
    """It gives each document of a packed window its losses alone, in one graph, no host read."""
    out = tmp_path / "prepared"
    settings = Settings(DOCUMENTS["seq_len"], eval_fraction=0.1)
    prepare([str(short_documents_jsonl(tmp_path))], str(out), Tokenizer(None), 256, settings)
    task = load_task("lm", str(out), DOCUMENTS)
    sample = window_with_documents(task.train_dataset())
    torch.manual_seed(0)
    model = task.build_model().eval()
    spans = document_spans(sample["positions"])
    with torch.no_grad():  # the reference: each document alone, in eager PyTorch on the CPU
        alone = [per_token_losses(model(sample["x"][None, a:b]), sample["y"][None, a:b])
                 for a, b in spans]  # fmt: skip
        unmasked = per_token_losses(model(sample["x"][None]), sample["y"][None])
        on_device = compiled(copy.deepcopy(model).to(device))
        x, y, positions = (sample[key][None].to(device) for key in ("x", "y", "positions"))
        ops.sync()
        before = health.snapshot()
        packed = per_token_losses(on_device(x, positions), y)
        ops.sync()
        counted = health.snapshot().since(before)
    assert (counted.compilations, counted.transfers) == (1, 0), counted

    packed = packed.cpu()
    assert len(spans) >= 4
    for (start, end), losses in zip(spans, alone, strict=True):
        assert torch.allclose(packed[start:end], losses, rtol=0, atol=1e-5), (start, end)
    # Unmasked, every document after the first reads its neighbours: its losses change.
    for (start, end), losses in zip(spans[1:], alone[1:], strict=True):
        assert (unmasked[start:end] - losses).abs().max() > 1e-3, (start, end)
{%- if cookiecutter.backend == "torch_xla" %}


# The `context` axis is torch_xla's (torch_tpu offers data, fsdp and tensor), and the
# activations per device are read from XLA's buffer assignment.
# Sequences of 2048 tokens of short documents, a global batch of 2, on one device and split
# over 8.
LONG = {"seq_len": 2048, "dim": 32, "layers": 1, "heads": 8}
EIGHT = ("--devices", "8", "--strategy")
MESHES = {
    "one device": ("--devices", "1", "--batch-size", "2"),
    "context=8": (*EIGHT, "spmd", "--mesh", "context=8", "--batch-size", "2"),
    "context=4,fsdp=2": (*EIGHT, "fsdp", "--mesh", "context=4,fsdp=2", "--batch-size", "1"),
}
TEMPORARY = re.compile(r"allocation \d+: size (\d+), preallocated-temp")


def step_temporaries(dump: Path) -> int:
    """The largest temporary buffer XLA's buffer assignment gives a compiled program on one
    device (the training step's): XLA:CPU reports no device memory, its compiler this."""
    sizes = [int(size) for path in dump.glob("*buffer-assignment.txt")
             for size in TEMPORARY.findall(path.read_text())]  # fmt: skip
    return max(sizes)


def planned_activations(folder: Path, mesh: str, accelerator: str) -> int:
    from {{ cookiecutter.package_name }}.planning.cli import Request, make_plan

    config = write_config(folder, task="lm", task_options=LONG)
    request = Request(config, [], None, None, None, accelerator, mesh, None, 2, None, None,
                      None, 0.1)  # fmt: skip
    return int(make_plan(request).estimate.activations)


@pytest.mark.slow
def test_long_sequence_evaluation_fits_where_its_training_does(tmp_path: Path) -> None:
    """It evaluates seq_len 2048 on context=4,fsdp=2 with the default eval settings at the
    training batch, never padded past the split: the run's host peak stays within 1.5x of
    its training steps' peak (XLA:CPU keeps the devices' buffers in host memory)."""
    data = tmp_path / "prepared"
    corpus = short_documents_jsonl(tmp_path, count=1200)
    settings = Settings(LONG["seq_len"], eval_fraction=0.2)
    prepare([str(corpus)], str(data), Tokenizer(None), 256, settings)
    config = write_config(tmp_path, task="lm", task_options=LONG, eval_batch_size=0,
                          max_steps=3, log_every=1, data=str(data))  # fmt: skip
    run = tmp_path / "run"
    done = cli("train", "--config", str(config), "--run-dir", str(run), *MESHES["context=4,fsdp=2"])
    assert done.returncode == 0, done.stderr[-3000:]

    summary = json.loads((run / "summary.json").read_text())
    assert "global batch 2 (1 per device of the data axes), eval batch 2" in done.stdout
    assert summary["status"] == "completed" and summary["eval"]["loss"] > 0
    memory = summary["memory"]
    assert memory["host_peak_bytes"] <= 1.5 * memory["host_peak_bytes_training"], memory


@pytest.mark.slow
def test_context_axis_trains_long_sequences_like_one_device_on_a_share_of_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It trains packed documents at seq_len 2048 over context=8 and context=4,fsdp=2 with one
    device's losses, one replayed graph each, the activations per device falling with the
    context axis (plan and XLA)."""
    data = tmp_path / "prepared"
    corpus = short_documents_jsonl(tmp_path, count=1200)
    settings = Settings(LONG["seq_len"], eval_fraction=0.2)
    prepare([str(corpus)], str(data), Tokenizer(None), 256, settings)
    runs, temporaries, planned = {}, {}, {}
    for name, args in MESHES.items():
        folder = tmp_path / re.sub(r"\W", "-", name)
        folder.mkdir()
        config = write_config(folder, task="lm", task_options=LONG, eval_batch_size=1,
                              max_steps=4, log_every=1, seed=3, data=str(data))  # fmt: skip
        monkeypatch.setenv("XLA_FLAGS", f"--xla_dump_to={folder / 'xla'}")  # the child's
        done = cli("train", "--config", str(config), "--run-dir", str(folder / "run"), *args)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = json.loads((folder / "run" / "summary.json").read_text())
        temporaries[name] = step_temporaries(folder / "xla")
        mesh, accelerator = (None, "v5litepod-1") if name == "one device" else (name, "v5litepod-8")
        planned[name] = planned_activations(folder, mesh or "fsdp=1", accelerator)

    reference = runs["one device"]["train_losses"]
    for name, summary in runs.items():
        assert summary["global_batch"] == 2 and summary["loop_compilations"] == 1, name
        step = {"replayed": True, "traced_because": None, "warmup_reads": 0}
        assert summary["step"] == step, name
        for (step, loss), (_, expected) in zip(summary["train_losses"], reference, strict=True):
            assert loss == pytest.approx(expected, rel=1e-5), (name, step)
    # Each device holds an eighth of the tokens: the plan says an eighth of the activations,
    # and XLA's buffers for the step shrink about as much.
    for name in ("context=8", "context=4,fsdp=2"):
        assert planned[name] == pytest.approx(planned["one device"] / 8, rel=0.01), planned
        assert temporaries[name] < temporaries["one device"] / 4, temporaries
{%- endif %}
