"""The digits CNN learns: at least 90% eval accuracy."""

from __future__ import annotations

import json
from pathlib import Path

from training_helpers import cli


def test_vision_reaches_90_percent(tmp_path: Path) -> None:
    """It classifies held-out digits with at least 90% accuracy."""
    run_dir = tmp_path / "run"
    result = cli(
        "train", "--accelerator", "cpu", "--max-epochs", "6", "--log-every", "50",
        "--run-dir", str(run_dir),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval"]["accuracy"] >= 0.9, summary["eval"]
