"""Every supported option combination bakes a clean, complete project."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from helpers import COMBOS, TEMPLATE_DIR, Baked, load_hook, tool_env

POST_GEN = load_hook("post_gen_project")

# Jinja that survived rendering: an expression or statement naming the
# template's variables, or any statement tag.
UNRENDERED = re.compile(r"\{\{-?\s*cookiecutter|\{%|\bcookiecutter\.(?!json\b)\w")
TASK_FILES = {
    "lm": ("tasks/lm.py", "tests/test_task_lm.py", "configs/lm.toml"),
    "vision": (
        "tasks/vision.py",
        "tests/test_task_vision.py",
        "configs/vision.toml",
    ),
    "hf-causal-lm": (
        "tasks/hf_causal_lm.py",
        "tests/test_task_hf_causal_lm.py",
        "configs/hf-causal-lm.toml",
    ),
}


# A relative link of a Markdown file (no scheme, not an anchor alone), and a test file named
# (the project's own: the command inventory names the template's as `template: tests/...`).
RELATIVE_LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:|#)([^)\s#]+)")
TEST_FILE = re.compile(r"(?<![\w/.-])(?<!template: )(?:tests/)?(test_\w+\.py)\b")


@pytest.fixture(params=list(COMBOS), scope="module")
def baked(request: pytest.FixtureRequest, bake_combo: Callable[[str], Baked]) -> Baked:
    """A project baked from one named combination."""
    return bake_combo(request.param)


def text_files(root: Path) -> Iterator[tuple[Path, str]]:
    """Yield every UTF-8 text file under root with its content."""
    for path in sorted(root.rglob("*")):
        if path.is_file() and ".git" not in path.parts:
            try:
                yield path, path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue


def task_path(baked: Baked, relative: str) -> Path:
    """Resolve a task file: package-relative for code, project-relative otherwise."""
    if relative.startswith("tasks/"):
        return baked.package_dir / relative
    return baked.path / relative


def run_ruff(baked: Baked, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ruff on the baked project with the project's own configuration."""
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args],
        cwd=baked.path,
        env=tool_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_bakes_without_error(baked: Baked) -> None:
    """It bakes the combination into a directory named after the slug."""
    assert baked.exit_code == 0, baked.exception
    assert baked.path.is_dir()
    assert baked.path.name == baked.context["project_slug"]
    assert baked.package_dir.is_dir()


def test_leaves_nothing_unrendered(baked: Baked) -> None:
    """It renders every template expression in file contents and names."""
    leftovers = [
        f"{path.relative_to(baked.path)}: {match.group(0)!r}"
        for path, text in text_files(baked.path)
        for match in [UNRENDERED.search(text)]
        if match
    ]
    odd_names = [
        str(p) for p in baked.path.rglob("*") if "{{" in p.name or "cookiecutter." in p.name
    ]
    odd_names = [name for name in odd_names if not name.endswith(".cookiecutter.json")]
    assert not leftovers, leftovers
    assert not odd_names, odd_names


def test_pyproject_pins_torch_and_torch_xla_together(baked: Baked) -> None:
    """It pins torch and torch_xla to the same release (torch_tpu: torch 2.13.0 alone, TorchTPU
    in the `tpu` extra) and names the console script."""
    pyproject = tomllib.loads((baked.path / "pyproject.toml").read_text(encoding="utf-8"))
    project = pyproject["project"]
    dependencies = project["dependencies"]
    if baked.context["backend"] == "torch_tpu":
        assert "torch==2.13.0" in dependencies
        assert not [d for d in dependencies if d.startswith("torch_xla")]
        assert project["optional-dependencies"]["tpu"] == ["torch-tpu==0.2.0"]
    else:
        assert "torch==2.9.0" in dependencies
        assert "torch_xla==2.9.0" in dependencies
    assert project["name"] == baked.context["project_slug"]
    assert project["requires-python"] == f">={baked.context['python_version']}"
    assert (
        project["scripts"][baked.context["project_slug"]]
        == f"{baked.context['package_name']}.cli:main"
    )


def test_ruff_check_is_clean(baked: Baked) -> None:
    """It passes the project's own ruff lint rules on first bake."""
    result = run_ruff(baked, "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_leaves_files_unchanged(baked: Baked) -> None:
    """It is already formatted the way the project's ruff formats it."""
    result = run_ruff(baked, "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_keeps_only_the_chosen_example_task(baked: Baked) -> None:
    """It keeps the chosen example task's files and prunes the other task's."""
    chosen = baked.context["example_task"]
    other_backend = set(POST_GEN.OTHER_BACKEND_PRUNE.get(baked.context["backend"], ()))
    for task, files in TASK_FILES.items():
        for relative in files:
            path = task_path(baked, relative)
            if relative in other_backend:
                assert not path.exists(), f"not pruned for {baked.context['backend']}: {relative}"
            elif task == chosen:
                assert path.is_file(), f"missing {relative}"
            else:
                assert not path.exists(), f"not pruned: {relative}"


def test_emits_one_backend(baked: Baked) -> None:
    """It leaves no backend folder behind, and the chosen backend's core in core/; a torch_tpu
    bake keeps every test file of the shared code (all but the torch_xla-only ones)."""
    assert not (baked.path / POST_GEN.BACKENDS_DIR).exists()
    core = baked.package_dir / "core"
    runtime = (core / "runtime.py").read_text(encoding="utf-8")
    if baked.context["backend"] == "torch_tpu":
        assert "torch.distributed" in runtime and "import torch_xla" not in runtime
        assert not (core / "strategies" / "spmd.py").exists()
        assert (baked.path / "tests" / "test_distributed.py").is_file()
        pruned = {*POST_GEN.paths_to_prune(baked.context), *POST_GEN.TORCH_XLA_ONLY}
        template_tests = TEMPLATE_DIR / "{{cookiecutter.project_slug}}" / "tests"
        shared = {f"tests/{path.name}" for path in template_tests.glob("test_*.py")}
        missing = sorted(path for path in shared - pruned if not (baked.path / path).is_file())
        assert not missing, missing
    else:
        assert "torch_xla.runtime" in runtime
        assert (core / "strategies" / "spmd.py").is_file()
        assert not (baked.path / "tests" / "test_distributed.py").exists()


def test_docs_link_and_name_only_what_the_bake_has(baked: Baked) -> None:
    """It resolves every relative link of the README and docs/, and finds in tests/ every
    test file they name, whatever the backend and example."""
    documents = [baked.path / "README.md", *sorted((baked.path / "docs").glob("*.md"))]
    broken, missing = [], []
    for document in documents:
        text = document.read_text(encoding="utf-8")
        for target in RELATIVE_LINK.findall(text):
            if not (document.parent / target).exists():
                broken.append(f"{document.name} -> {target}")
        for name in TEST_FILE.findall(text):
            if not (baked.path / "tests" / name).is_file():
                missing.append(f"{document.name} names tests/{name}")
    assert not broken, broken
    assert not missing, missing


def test_records_answers_without_absolute_paths(baked: Baked) -> None:
    """It records the answers for re-baking, free of machine-specific paths."""
    recorded = json.loads((baked.path / ".cookiecutter.json").read_text(encoding="utf-8"))
    answers = recorded["cookiecutter"]
    for key in ("project_name", "package_name", "accelerator_type", "example_task"):
        assert answers[key] == baked.context[key]
    assert not [key for key in answers if key.startswith("_")]
    absolute = [
        value for value in answers.values() if isinstance(value, str) and Path(value).is_absolute()
    ]
    assert not absolute
    assert str(baked.path.parent) not in json.dumps(recorded)


def test_marks_shell_scripts_executable(baked: Baked) -> None:
    """It ships shell scripts (the TPU VM startup script) as executables."""
    scripts = sorted((baked.path / "scripts").glob("*.sh"))
    assert scripts, "no scripts/*.sh baked"
    not_executable = [s.name for s in scripts if not os.access(s, os.X_OK)]
    assert not not_executable
