"""Benchmark tasks through lm-evaluation-harness: tasks by name from its registry or from a
folder of task YAML files (local or gs://), results in its own JSON, metrics by name."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MISSING = "benchmark tasks run through lm-evaluation-harness: pip install -e '.[eval]'"


class HarnessError(ValueError):
    """Tasks lm-eval does not know, or a harness that is not installed; the message says why."""


def check_installed() -> None:
    if importlib.util.find_spec("lm_eval") is None:
        raise HarnessError(MISSING)


@contextmanager
def task_folder(include_path: str | None) -> Iterator[str | None]:
    """The folder of the user's task YAML files, on local disk (a gs:// one copied first)."""
    if not include_path or "://" not in include_path:
        if include_path and not Path(include_path).is_dir():
            raise HarnessError(
                f"--include-path {include_path!r} is not a folder of task YAML files"
            )
        yield include_path
        return
    import fsspec

    with tempfile.TemporaryDirectory() as local:
        fs, root = fsspec.core.url_to_fs(include_path)
        if not fs.isdir(root):
            raise HarnessError(
                f"--include-path {include_path!r} is not a folder of task YAML files"
            )
        fs.get(root.rstrip("/") + "/", local + "/", recursive=True)
        yield local


def task_manager(include_path: str | None) -> Any:
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path) if include_path else TaskManager()


def check_tasks(manager: Any, tasks: Sequence[str]) -> None:
    """Refuse, before any model is built, a task name lm-eval's registry and the user's folder
    do not hold."""
    known = set(manager.all_tasks)
    unknown = [task for task in tasks if task not in known]
    if unknown:
        raise HarnessError(
            f"lm-eval knows no task {unknown[0]!r} (neither its registry nor --include-path "
            "holds it): `lm_eval ls tasks` lists its own; a task of yours is a YAML file in "
            "the --include-path folder"
        )


def evaluate(
    lm: Any,
    tasks: Sequence[str],
    manager: Any,
    limit: float | None = None,
    num_fewshot: int | None = None,
    log_samples: bool = False,
    seed: int = 0,
) -> dict[str, Any]:
    """lm-eval's `simple_evaluate` of `lm` on `tasks`: its results dictionary."""
    from lm_eval import simple_evaluate

    results = simple_evaluate(
        model=lm,
        tasks=list(tasks),
        task_manager=manager,
        limit=limit,
        num_fewshot=num_fewshot,
        log_samples=log_samples,
        bootstrap_iters=0,
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        fewshot_random_seed=seed,
    )
    return dict(results or {})


def metrics(results: dict[str, Any]) -> dict[str, float]:
    """`task/metric` -> value for every number lm-eval reports (its `,none` filter dropped)."""
    found: dict[str, float] = {}
    for task, values in results.get("results", {}).items():
        for key, value in values.items():
            if key == "alias" or "_stderr" in key or not isinstance(value, int | float):
                continue
            if isinstance(value, bool) or not math.isfinite(float(value)):
                continue
            metric = key.removesuffix(",none").replace(",", "_")
            found[f"{task}/{metric}"] = float(value)
    return found


def write(results: dict[str, Any], out: Path) -> list[Path]:
    """lm-eval's results as its CLI writes them: `results.json`, and the per-sample records of
    each task (`samples_<task>.jsonl`) when they were kept. Written aside, then moved."""
    from lm_eval.utils import handle_non_serializable

    out.mkdir(parents=True, exist_ok=True)
    samples = results.pop("samples", None) or {}
    files: list[Path] = []

    def put(name: str, text: str) -> None:
        path = out / name
        partial = out / f".{name}.partial"
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
        files.append(path)

    put("results.json", json.dumps(results, indent=2, default=handle_non_serializable) + "\n")
    for task, records in samples.items():
        lines = (
            json.dumps(r, default=handle_non_serializable, ensure_ascii=False) for r in records
        )
        put(f"samples_{task}.jsonl", "".join(line + "\n" for line in lines))
    if samples:
        results["samples"] = samples
    return files


def table(results: dict[str, Any]) -> str:
    """lm-eval's own results table."""
    from lm_eval.utils import make_table

    return str(make_table(results))
