"""Rank-0 reporting: a rich progress bar or plain lines, the loggers (TensorBoard, W&B),
summary.json."""

from __future__ import annotations

import json
import sys
import time
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
        self.total = total
        self._warm: tuple[int, float] | None = None  # (step, time) once warm-up has run
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
                TextColumn("{task.fields[left]}"),
                console=self.console,
            )
            self._bar = self.progress.add_task("train", total=total, status="", left="")
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

    def warmed_up(self, step: int) -> None:
        """From here on the steps run at their steady pace: the time left is estimated from
        them (evaluations and checkpoints included, as they recur)."""
        self._warm = (step, time.monotonic())

    def time_left(self, step: int) -> float | None:
        """Seconds to the last step at the pace since warm-up (None before it)."""
        if self._warm is None or step <= self._warm[0]:
            return None
        since, started = self._warm
        pace = (time.monotonic() - started) / (step - since)
        return max(0, self.total - step) * pace

    def scalars(self, step: int, values: dict[str, float], prefix: str) -> None:
        if not self.enabled:
            return
        for logger in self.loggers:
            logger.scalars(step, values, prefix)
        text = " ".join(f"{k}={_number(v)}" for k, v in values.items())
        left = self.time_left(step) if prefix == "train" else None
        left_text = "" if left is None else f"left {_duration(left)}"
        if self.progress is not None:
            self.progress.update(self._bar, completed=step, status=f"{prefix} {text}")
            if left is not None:
                self.progress.update(self._bar, left=left_text)
            return
        line = f"step {step}/{self.total} {prefix} {text}"
        self._print(f"{line} {left_text}" if left_text else line)

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


def steps_line(total: int, max_steps: int, epochs: int, per_epoch: int | None, done: int) -> str:
    """What the run will train: its steps, where they come from, and how many are done."""
    source = "max_steps" if max_steps > 0 else f"{epochs} epoch(s) of {per_epoch}"
    start = f", from step {done}" if done else ""
    return f"steps: {total} ({source}){start}"


def _duration(seconds: float) -> str:
    """1h02m, 3m05s, 12s: what a person reads at a glance."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _number(value: float) -> str:
    """Four decimals for losses and rates, one for hundreds, three digits for big counts."""
    if abs(value) >= 1e5:
        return f"{value:.3g}"
    return f"{value:.1f}" if abs(value) >= 100 else f"{value:.4f}"
