"""Rank-0 reporting: a rich progress bar or plain lines, the loggers (TensorBoard, W&B),
summary.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .loggers import open_loggers


class Reporter:
    """Writes only when `enabled` (the master process); every method is cheap otherwise."""

    def __init__(
        self, run_dir: Path, total: int, enabled: bool, loggers: list[Any] | None = None
    ) -> None:
        self.enabled = enabled
        self.run_dir = run_dir
        self.console = Console(file=sys.stdout)
        self.loggers: list[Any] = loggers or []
        self.progress: Progress | None = None
        if not enabled:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        if self.console.is_terminal:
            self.progress = Progress(
                TextColumn("train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"),
                TimeElapsedColumn(),
                console=self.console,
            )
            self._bar = self.progress.add_task("train", total=total, status="")
            self.progress.start()

    @classmethod
    def of_run(cls, config: Any, checkpoint_dir: str, total: int, enabled: bool) -> Reporter:
        """The run's reporter, with the loggers its config names (opened on the master only)."""
        run_dir = Path(config.run_dir)
        if not enabled:
            return cls(run_dir, total, enabled)
        run_dir.mkdir(parents=True, exist_ok=True)
        return cls(run_dir, total, enabled, open_loggers(config, run_dir, checkpoint_dir))

    def line(self, text: str) -> None:
        """A line of the run's report: printed, and kept by the loggers that keep text."""
        if self.enabled:
            self._print(text)
            for logger in self.loggers:
                logger.line(text)

    def _print(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True)

    def scalars(self, step: int, values: dict[str, float], prefix: str) -> None:
        if not self.enabled:
            return
        for logger in self.loggers:
            logger.scalars(step, values, prefix)
        text = " ".join(f"{k}={_number(v)}" for k, v in values.items())
        if self.progress is not None:
            self.progress.update(self._bar, completed=step, status=f"{prefix} {text}")
        else:
            self._print(f"step {step} {prefix} {text}")

    def summary(self, data: dict[str, Any]) -> Path | None:
        """Write summary.json, give it to the loggers, close everything, and return the path."""
        if not self.enabled:
            return None
        if self.progress is not None:
            self.progress.stop()
        path = self.run_dir / "summary.json"
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        loggers, self.loggers = self.loggers, []  # the lines after this are the terminal's
        for logger in loggers:
            logger.summary(data)
        return path


def _number(value: float) -> str:
    """Four decimals for losses and rates, one for hundreds, three digits for big counts."""
    if abs(value) >= 1e5:
        return f"{value:.3g}"
    return f"{value:.1f}" if abs(value) >= 100 else f"{value:.4f}"
