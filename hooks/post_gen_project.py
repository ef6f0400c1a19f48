"""Finish the baked project: prune unchosen parts, mark scripts executable,
record the answers for re-baking and print the next steps.

Runs inside the new project directory. The answers enter as data (JSON
rendered by cookiecutter), never as code.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# For each choice, the files that belong only to the options not chosen.
# Paths are relative to the project root; `{package}` is the import name.
# The files of each example task.
TASK_FILES: dict[str, tuple[str, ...]] = {
    "lm": ("src/{package}/tasks/lm.py", "tests/test_task_lm.py", "configs/lm.toml"),
    "vision": ("src/{package}/tasks/vision.py", "tests/test_task_vision.py", "configs/vision.toml"),
    "hf-causal-lm": (
        "src/{package}/tasks/hf_causal_lm.py",
        "tests/test_task_hf_causal_lm.py",
        "tests/test_hf_models.py",
        "tests/test_hf_moe.py",
        "tests/test_lora.py",
        "tests/test_hf_export.py",
        "tests/test_pretrained_weights.py",
        "tests/test_pretrained_run.py",
        "tests/test_generation.py",
        "tests/test_benchmarks.py",
        "tests/test_dpo.py",
        "tests/test_grpo.py",
        "benchmarks/dpo_bench.py",
        "src/{package}/alignment",
        "tests/hf_helpers.py",
        "configs/hf-causal-lm.toml",
        "benchmarks/load_bench.py",
        "benchmarks/generate_bench.py",
        "docs/hugging-face.md",
        "docs/evaluation.md",
        "docs/alignment.md",
    ),
}
# The corpus helpers and the data package (`prepare`, prepared datasets) serve the text tasks,
# and so do generation (`generate`) and the pages on data and long sequences.
TEXT_TASK_FILES = (
    "src/{package}/tasks/_corpus.py",
    "src/{package}/data",
    "src/{package}/generation",
    "src/{package}/harness",
    "tests/data_helpers.py",
    "tests/test_data_prepare.py",
    "tests/test_data_training.py",
    "tests/test_data_ray.py",
    "configs/ray-cluster.yaml",
    "scripts/ray-node.sh",
    "benchmarks/data_bench.py",
    "benchmarks/read_bench.py",
    "benchmarks/long_bench.py",
    "docs/data.md",
    "docs/long-sequences.md",
)


def _other_tasks(chosen: str) -> tuple[str, ...]:
    files = [path for task, paths in TASK_FILES.items() if task != chosen for path in paths]
    return tuple(files) + (TEXT_TASK_FILES if chosen == "vision" else ())


# For each choice, the files that belong only to the options not chosen.
# Paths are relative to the project root; `{package}` is the import name.
PRUNE: dict[str, dict[str, tuple[str, ...]]] = {
    "example_task": {task: _other_tasks(task) for task in TASK_FILES},
}

# Each backend's own modules and tests live under BACKENDS_DIR/<backend>/, mirroring the
# project's layout: the chosen backend's files are moved over the project (replacing the
# default's, adding its own), then the folder goes. The default backend has none there.
BACKENDS_DIR = "_backends"
# Files of the default backend (torch_xla) that another backend's bake does without: its
# modules, and the tests whose subject only torch_xla has (its sharding specs, its scan, its
# programs' buffer assignment). The tests of the shared code run in every bake; what they
# expect of a backend, the bake's tests/conftest.py and tests/backend_facts.py say.
TORCH_XLA_ONLY = (
    "benchmarks/contenders.py",
    "benchmarks/workloads.py",
    "benchmarks/profiling.py",
    "benchmarks/report.py",
    "src/{package}/core/checkpoint_planner.py",
    "src/{package}/core/strategies/spmd.py",
    "tests/test_sharding.py",
    "tests/test_scan.py",
    "tests/test_xla_memory.py",
)
OTHER_BACKEND_PRUNE = {"torch_tpu": TORCH_XLA_ONLY}

ANSWERS_FILE = ".cookiecutter.json"
EXECUTABLE_GLOBS = ("scripts/*.sh",)
# A template location worth recording: remote, so it means the same on any machine.
REMOTE_TEMPLATE_RE = re.compile(r"^(gh:|gl:|bb:|git\+|https?://|ssh://|git@)")
WINDOWS_ABSOLUTE_RE = re.compile(r"^[A-Za-z]:[\\/]")


def paths_to_prune(answers: Mapping[str, Any]) -> list[str]:
    """Return the relative paths that belong only to the options not chosen."""
    package = answers["package_name"]
    paths: list[str] = []
    for key, by_choice in PRUNE.items():
        for template in by_choice.get(answers[key], ()):
            paths.append(template.format(package=package))
    return paths


def prune(project_dir: Path, answers: Mapping[str, Any]) -> list[Path]:
    """Delete the unchosen files (and folders) that exist and return what was deleted."""
    removed: list[Path] = []
    for relative in paths_to_prune(answers):
        path = project_dir / relative
        if path.is_file() or path.is_symlink():
            path.unlink()
            removed.append(path)
        elif path.is_dir():
            shutil.rmtree(path)
            removed.append(path)
    return removed


def apply_backend(project_dir: Path, answers: Mapping[str, Any]) -> list[Path]:
    """Put the chosen backend's files in place and drop every backend folder; return the
    files moved in."""
    backend = answers.get("backend", "torch_xla")
    package = answers["package_name"]
    folder = project_dir / BACKENDS_DIR
    moved: list[Path] = []
    for relative in OTHER_BACKEND_PRUNE.get(backend, ()):
        path = project_dir / relative.format(package=package)
        if path.is_file():
            path.unlink()
    chosen = folder / backend
    if chosen.is_dir():
        for source in sorted(p for p in chosen.rglob("*") if p.is_file()):
            target = project_dir / source.relative_to(chosen)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
            moved.append(target)
    if folder.exists():
        shutil.rmtree(folder)
    return moved


def make_executable(project_dir: Path, globs: Iterable[str] = EXECUTABLE_GLOBS) -> list[Path]:
    """Add the execute bits wherever read bits are set on the matching files."""
    changed: list[Path] = []
    for pattern in globs:
        for path in sorted(project_dir.glob(pattern)):
            mode = path.stat().st_mode
            # Grant execute to whoever may read: r-- becomes r-x.
            path.chmod(mode | ((mode & 0o444) >> 2) | stat.S_IXUSR)
            changed.append(path)
    return changed


def is_absolute_path(value: Any) -> bool:
    """Tell whether a value is an absolute path on any platform."""
    if not isinstance(value, str):
        return False
    return value.startswith(("/", "~", "\\\\")) or bool(WINDOWS_ABSOLUTE_RE.match(value))


def answers_to_record(answers: Mapping[str, Any]) -> dict[str, Any]:
    """Keep the answers a re-bake needs; drop machine-specific and private keys."""
    recorded: dict[str, Any] = {}
    for key, value in answers.items():
        if key.startswith("_") and key != "_template":
            continue
        if key == "_template" and not (isinstance(value, str) and REMOTE_TEMPLATE_RE.match(value)):
            continue
        if is_absolute_path(value):
            continue
        recorded[key] = value
    return recorded


def record_answers(project_dir: Path, answers: Mapping[str, Any]) -> Path:
    """Write the answers in cookiecutter's replay format (`--replay-file`)."""
    path = project_dir / ANSWERS_FILE
    content = {"cookiecutter": answers_to_record(answers)}
    path.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def next_steps(answers: Mapping[str, Any]) -> str:
    """Return the commands to run first in the new project."""
    slug = answers["project_slug"]
    return "\n".join(
        [
            f"Baked {slug} ({answers['example_task']} example, {answers['accelerator_type']}).",
            "Next steps:",
            f"  cd {slug}",
            "  make install        # virtual environment with "
            + (
                "torch and torch_xla"
                if answers.get("backend", "torch_xla") == "torch_xla"
                else "torch (TorchTPU on a TPU VM)"
            ),
            "  make test           # the core, proven on "
            + (
                "XLA:CPU"
                if answers.get("backend", "torch_xla") == "torch_xla"
                else "CPU processes (gloo)"
            ),
            "  make train-single   # train the example on one device",
            "  make help           # every other target (TPU VM, pod, Docker)",
        ]
    )


def run(project_dir: Path, answers: Mapping[str, Any]) -> int:
    """Finish the project in project_dir and print what to do next."""
    prune(project_dir, answers)
    apply_backend(project_dir, answers)
    make_executable(project_dir)
    record_answers(project_dir, answers)
    print(next_steps(answers), flush=True)
    return 0


def rendered_answers() -> dict[str, Any]:
    """Return the answers after cookiecutter rendered them."""
    return json.loads(
        r"""
{{ cookiecutter | tojson }}
""".strip()
    )


def main() -> int:
    """Finish the project cookiecutter just wrote in the working directory."""
    try:
        return run(Path(os.getcwd()), rendered_answers())
    except OSError as error:
        print(f"ERROR: could not finish the project: {error}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    # cookiecutter runs this hook from a copy it renders into the temp folder and keeps there
    if Path(sys.argv[0]).parent.resolve() == Path(tempfile.gettempdir()).resolve():
        Path(sys.argv[0]).unlink(missing_ok=True)  # read already: the hook runs on
    raise SystemExit(main())
