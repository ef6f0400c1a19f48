"""Rank-0 reporting: TensorBoard scalars, a rich progress bar or plain lines, summary.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class Reporter:
    """Writes only when `enabled` (the master process); every method is cheap otherwise."""

    def __init__(self, run_dir: Path, total_steps: int, enabled: bool) -> None:
        self.enabled = enabled
        self.run_dir = run_dir
        self.console = Console(file=sys.stdout)
        self.writer: Any = None
        self.progress: Progress | None = None
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter

        run_dir.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(str(run_dir / "tensorboard"))
        if self.console.is_terminal:
            self.progress = Progress(
                TextColumn("train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"),
                TimeElapsedColumn(),
                console=self.console,
            )
            self._bar = self.progress.add_task("train", total=total_steps, status="")
            self.progress.start()

    def line(self, text: str) -> None:
        if self.enabled:
            self.console.print(text, highlight=False, soft_wrap=True)

    def scalars(self, step: int, values: dict[str, float], prefix: str) -> None:
        if not self.enabled:
            return
        for key, value in values.items():
            self.writer.add_scalar(f"{prefix}/{key}", value, step)
        text = " ".join(f"{k}={_number(v)}" for k, v in values.items())
        if self.progress is not None:
            self.progress.update(self._bar, completed=step, status=f"{prefix} {text}")
        else:
            self.line(f"step {step} {prefix} {text}")

    def summary(self, data: dict[str, Any]) -> Path | None:
        """Write summary.json, close everything, and return the path."""
        if not self.enabled:
            return None
        if self.progress is not None:
            self.progress.stop()
        self.writer.close()
        path = self.run_dir / "summary.json"
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        return path


def _number(value: float) -> str:
    """Four decimals for losses and rates, one for hundreds, three digits for big counts."""
    if abs(value) >= 1e5:
        return f"{value:.3g}"
    return f"{value:.1f}" if abs(value) >= 100 else f"{value:.4f}"
