"""Benchmark tasks inside a run: lm-eval's `eval_tasks` on the model as it trains, beside each
loss evaluation, the scoring steps compiled once and reused at every evaluation."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from torch import nn

from . import run


class RunBenchmarks:
    """`eval_tasks` of a run's config, over its model as laid out for training."""

    def __init__(
        self,
        config: Any,
        task: Any,
        model: nn.Module,
        strategy: Any,
        host_read: Callable[[], contextlib.AbstractContextManager[Any]],
    ) -> None:
        from ..generation.model import task_tokenizer
        from .model import ProjectLM

        self.tasks = tuple(config.eval_tasks)
        self.limit = config.eval_tasks_limit or None
        self.seed = config.seed
        self._folder = contextlib.ExitStack()
        folder = self._folder.enter_context(run.task_folder(config.eval_tasks_path or None))
        self.manager = run.task_manager(folder)
        run.check_tasks(self.manager, self.tasks)
        self.lm = ProjectLM(
            model, task_tokenizer(task), strategy, tuple(config.eval_tasks_buckets),
            config.eval_tasks_slots, host_read=host_read,
        )  # fmt: skip

    def __call__(self) -> dict[str, float]:
        """`task/metric` of every task, now."""
        results = run.evaluate(self.lm, self.tasks, self.manager, self.limit, seed=self.seed)
        return run.metrics(results)

    def close(self) -> None:
        self._folder.close()
