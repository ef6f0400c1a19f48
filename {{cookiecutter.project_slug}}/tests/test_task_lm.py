"""The character language model learns: well below the unigram baseline, ties intact, each
packed document read alone."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torch_xla

from {{ cookiecutter.package_name }}.core import health
from {{ cookiecutter.package_name }}.data.encoding import Tokenizer
from {{ cookiecutter.package_name }}.data.prepare import Settings, prepare
from {{ cookiecutter.package_name }}.tasks import load_task

from data_helpers import document_spans, short_documents_jsonl, window_with_documents
from training_helpers import cli

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


def test_packed_documents_have_the_losses_they_have_alone(tmp_path: Path, xla_device: Any) -> None:
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
        on_device = copy.deepcopy(model).to(xla_device)
        x, y, positions = (sample[key][None].to(xla_device) for key in ("x", "y", "positions"))
        torch_xla.sync()
        before = health.snapshot()
        packed = per_token_losses(on_device(x, positions), y)
        torch_xla.sync()
        counted = health.snapshot().since(before)
    assert (counted.compilations, counted.transfers) == (1, 0), counted

    packed = packed.cpu()
    assert len(spans) >= 4
    for (start, end), losses in zip(spans, alone, strict=True):
        assert torch.allclose(packed[start:end], losses, rtol=0, atol=1e-5), (start, end)
    # Unmasked, every document after the first reads its neighbours: its losses change.
    for (start, end), losses in zip(spans[1:], alone[1:], strict=True):
        assert (unmasked[start:end] - losses).abs().max() > 1e-3, (start, end)
