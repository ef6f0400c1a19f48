"""The character language model learns: well below the unigram baseline, ties intact."""

from __future__ import annotations

import json
from pathlib import Path

from {{ cookiecutter.package_name }}.tasks import load_task

from training_helpers import cli


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
