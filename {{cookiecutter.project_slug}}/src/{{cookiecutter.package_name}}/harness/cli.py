"""`eval --tasks`: lm-evaluation-harness tasks on the model where it trained, every process of the
job running them and the first writing lm-eval's results, the table and TensorBoard's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from . import run


@dataclass(frozen=True)
class Benchmarks:
    """What `eval --tasks` was asked."""

    tasks: tuple[str, ...]
    include_path: str | None
    limit: float | None
    num_fewshot: int | None
    log_samples: bool
    out: str
    buckets: tuple[int, ...]
    slots: int
    checkpoint: str | None


def parse_tasks(text: str) -> tuple[str, ...]:
    """`arc_easy,gsm8k` as its names."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise run.HarnessError("no task named: --tasks arc_easy,hellaswag (lm-eval's names)")
    return names


def check(benchmarks: Benchmarks) -> None:
    """Refuse, before any model is built or anything written, what cannot run."""
    run.check_installed()
    with run.task_folder(benchmarks.include_path) as folder:
        run.check_tasks(run.task_manager(folder), benchmarks.tasks)


def run_benchmarks(cfg: Any, plan: Any, benchmarks: Benchmarks) -> dict[str, float] | None:
    """In every process: the model laid out, lm-eval over it; the first writes the results."""
    from ..generation.model import load_model
    from .model import ProjectLM

    loaded = load_model(cfg, plan, benchmarks.checkpoint)
    lm = ProjectLM(
        loaded.model, loaded.tokenizer, plan.strategy, benchmarks.buckets, benchmarks.slots
    )
    with run.task_folder(benchmarks.include_path) as folder:
        manager = run.task_manager(folder)
        results = run.evaluate(
            lm, benchmarks.tasks, manager, benchmarks.limit, benchmarks.num_fewshot,
            benchmarks.log_samples, cfg.seed,
        )  # fmt: skip
    if not plan.strategy.is_master():
        return None
    found = run.metrics(results)
    out = Path(benchmarks.out)
    files = run.write(results, out)
    write_events(out, found)
    typer.echo(run.table(results))
    samples = f" (and {len(files) - 1} sample file(s))" if len(files) > 1 else ""
    typer.echo(f"results: {files[0]}{samples}")
    return found


def write_events(out: Path, found: dict[str, float]) -> None:
    """The metrics as TensorBoard scalars `eval/<task>/<metric>` in `out/tensorboard`."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(out / "tensorboard"))
    for name, value in found.items():
        writer.add_scalar(f"eval/{name}", value, 0)
    writer.close()
