"""Small runs of this project's task, shared by the trainer and CLI tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from {{ cookiecutter.package_name }}.cli_common import EXIT_PREEMPTED

{% if cookiecutter.example_task == "lm" -%}
TINY: dict[str, Any] = {
    "task": "lm",
    "batch_size": 8,
    "eval_batch_size": 16,
    "task_options": {"seq_len": 16, "dim": 32, "layers": 1, "heads": 2, "max_bytes": 40000},
}
{%- elif cookiecutter.example_task == "hf-causal-lm" -%}
TINY: dict[str, Any] = {
    "task": "hf-causal-lm",
    "batch_size": 8,
    "eval_batch_size": 16,
    # A Llama with tied embeddings: the trap of untied weights stays under test.
    "task_options": {
        "seq_len": 16,
        "dim": 32,
        "layers": 1,
        "heads": 2,
        "max_bytes": 40000,
        "tie_embeddings": True,
    },
}
{%- else -%}
TINY: dict[str, Any] = {
    "task": "vision",
    "batch_size": 16,
    "eval_batch_size": 32,
    "task_options": {"width": 4},
}
{%- endif %}


# The goodput account at the end of a run imports ml-goodput-measurement (~2 s): the tiny runs
# keep no goodput records unless a test asks (the spot rehearsal measures them).
QUIET = {"accelerator": "cpu", "goodput": "off"}


def write_config(folder: Path, **overrides: Any) -> Path:
    """A YAML config of the tiny run plus overrides."""
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump({**TINY, **QUIET, **overrides}))
    return path


def cli_env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PJRT_DEVICE": "CPU", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    return env


def cli(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a fresh process (the XLA runtime starts once per process)."""
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", *args]
    return subprocess.run(
        command, env=cli_env(), capture_output=True, text=True, timeout=600, **kwargs
    )


def popen(*args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", *args]
    return subprocess.Popen(
        command, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def wait_for(process: subprocess.Popen[str], marker: str) -> list[str]:
    """Read the process's output until a line contains `marker`."""
    seen = []
    assert process.stdout is not None
    for line in process.stdout:
        seen.append(line)
        if marker in line:
            return seen
    raise AssertionError(f"{marker!r} never printed:\n{''.join(seen)}")


def preempt_then_resume(args: tuple[str, ...], run_dir: Path, step: int, steps: int) -> Any:
    """Train with `args`, SIGTERM the run after `step`, check it stopped preempted between
    `step` and `steps` (exit 75: saved, not done), resume it with `--resume auto`; the resumed
    run's summary."""
    process = popen(*args)
    wait_for(process, f"step {step} train")
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == EXIT_PREEMPTED, output
    stopped = json.loads((run_dir / "summary.json").read_text())
    assert stopped["status"] == "preempted" and step <= stopped["steps"] < steps

    resumed = cli(*args, "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return json.loads((run_dir / "summary.json").read_text())
