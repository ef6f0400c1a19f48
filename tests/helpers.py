"""Constants and helpers shared by the template's tests."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

TEMPLATE_DIR = Path(__file__).resolve().parent.parent
HOOKS_DIR = TEMPLATE_DIR / "hooks"
BIN_DIR = Path(sys.executable).parent
TEMPLATE_CONTEXT: dict[str, Any] = json.loads(
    (TEMPLATE_DIR / "cookiecutter.json").read_text(encoding="utf-8")
)
# The table of TPU generations, as the hooks receive it with the answers.
TPU_GENERATIONS: dict[str, Any] = TEMPLATE_CONTEXT["_tpu_generations"]

# Supported option combinations, each baked once per session. The ids read as
# what they exercise; keep the list short enough to run on two cores.
COMBOS: dict[str, dict[str, str]] = {
    "default-lm": {},
    "hf-causal-lm-fsdp-bf16-mixed": {
        "example_task": "hf-causal-lm",
        "strategy": "fsdp",
        "precision": "bf16-mixed",
    },
    "vision-bf16-mixed-spmd": {
        "example_task": "vision",
        "precision": "bf16-mixed",
        "strategy": "spmd",
    },
    "v4-8-ddp-bf16-true": {
        "accelerator_type": "v4-8",
        "strategy": "ddp",
        "precision": "bf16-true",
    },
    "v3-32-pod-lm": {
        "accelerator_type": "v3-32",
        "strategy": "ddp",
        "example_task": "lm",
    },
    "v6e-8-vision-py312": {
        "accelerator_type": "v6e-8",
        "example_task": "vision",
        "python_version": "3.12",
    },
    "v2-8-legacy-runtime-py310": {
        "accelerator_type": "v2-8",
        "runtime_version": "tpu-vm-pt-2.0",
        "strategy": "single",
        "python_version": "3.10",
    },
    "v5p-16-pod-spmd": {
        "accelerator_type": "v5p-16",
        "strategy": "spmd",
    },
    "torch-tpu-lm": {"backend": "torch_tpu"},
    "torch-tpu-hf-causal-lm-fsdp": {
        "backend": "torch_tpu",
        "example_task": "hf-causal-lm",
        "strategy": "fsdp",
    },
    "v5litepod-32-own-names": {
        "project_name": "My Big Model",
        "package_name": "bigmodel",
        "accelerator_type": "v5litepod-32",
        "gcp_project": "research-tpus-42",
    },
}

# A complete, valid set of rendered answers (what the default bake produces).
VALID_ANSWERS: dict[str, str] = {
    "project_name": "TPU Project",
    "project_slug": "tpu-project",
    "package_name": "tpu_project",
    "description": "A PyTorch/XLA training project.",
    "author_name": "Your Name",
    "author_email": "you@example.com",
    "accelerator_type": "v5litepod-8",
    "zone": "us-west4-a",
    "gcp_project": "my-gcp-project",
    "runtime_version": "v2-alpha-tpuv5-lite",
    "docker_image": "us-west4-docker.pkg.dev/my-gcp-project/tpu-project/train",
    "precision": "32-true",
    "strategy": "auto",
    "example_task": "lm",
    "python_version": "3.11",
    "backend": "torch_xla",
}
# The answers as the hooks receive them: with the private table of TPU generations.
HOOK_ANSWERS: dict[str, Any] = {**VALID_ANSWERS, "_tpu_generations": TPU_GENERATIONS}


def load_hook(name: str) -> ModuleType:
    """Import a hook script by path, unrendered, so its functions can be called."""
    spec = importlib.util.spec_from_file_location(f"hook_{name}", HOOKS_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Baked:
    """A project baked from one combination."""

    combo: str
    context: Mapping[str, Any]
    exit_code: int
    exception: BaseException | None
    path: Path

    @property
    def package_dir(self) -> Path:
        return self.path / "src" / self.context["package_name"]


def tool_env(**extra: str) -> dict[str, str]:
    """The environment for subprocesses: this interpreter's tools first on PATH."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN_DIR}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTEST_ADDOPTS", None)
    env.update(extra)
    return env


def pytest_summary(output: str) -> dict[str, int]:
    """Parse the counts from pytest's final summary line."""
    lines = [line for line in output.strip().splitlines() if re.search(r"\d+ \w+ in [\d.]+s", line)]
    assert lines, f"no pytest summary in:\n{output[-3000:]}"
    return {word: int(count) for count, word in re.findall(r"(\d+) (\w+)", lines[-1])}


def project_env(baked: Baked, **extra: str) -> dict[str, str]:
    """Environment that imports the baked package from src/ on XLA:CPU."""
    return tool_env(PYTHONPATH=str(baked.path / "src"), PJRT_DEVICE="CPU", **extra)


def run(
    command: list[str], env: dict[str, str], cwd: Path | None = None, timeout: int = 300
) -> subprocess.CompletedProcess[str]:
    """Run a command to completion, capturing its text output."""
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
