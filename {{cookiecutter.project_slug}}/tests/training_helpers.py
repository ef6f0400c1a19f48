"""Small runs of this project's task, shared by the trainer and CLI tests."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from {{ cookiecutter.package_name }}.cli_common import EXIT_PREEMPTED

from backend_facts import CHILD_ENV
from gates import Gate, children, signal_taken, wait_for_line, wait_taken
from threads_at_exit import LEFT as THREADS_LEFT

SRC = Path(__file__).resolve().parents[1] / "src"

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


def write_config(folder: Path, gate: Gate | None = None, **overrides: Any) -> Path:
    """A YAML config of the tiny run plus overrides; with `gate`, its training waits there
    (the task `gated`, in the package copy `gated_source` makes)."""
    settings = {**TINY, **QUIET, **overrides}
    if gate is not None:
        options = {"inner": settings["task"], "gate": str(gate.path), "gate_after": gate.steps,
                   "grad_accum": settings.get("grad_accum", 1)}  # fmt: skip
        settings.update(task="gated", task_options={**settings["task_options"], **options})
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


def gated_source(folder: Path) -> Path:
    """A copy of this project's `src` with the task `gated` added (tests/gated_task.py); its
    processes name the threads they leave running at exit (tests/threads_at_exit.py)."""
    copy = folder / "src"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__"))
    here = Path(__file__).parent
    shutil.copy(here / "gated_task.py", copy / "{{ cookiecutter.package_name }}" / "tasks" / "gated.py")
    shutil.copy(here / "threads_at_exit.py", copy / "sitecustomize.py")
    return copy


def threads_left(output: str) -> set[str]:
    """The threads of torch, torch_xla or this project that the processes of a gated source
    left running at exit (tests/threads_at_exit.py), from their output; a run none of whose
    processes got there (killed, aborted) fails the test."""
    said = [line for line in output.splitlines() if line.startswith(THREADS_LEFT)]
    assert said, f"the process ended before its last exit handler:\n{output[-3000:]}"
    left = {item for line in said for item in line.removeprefix(THREADS_LEFT).split(";")}
    return {item.strip() for item in left if TENSOR_CODE.search(item)}


# The modules whose threads run tensor code (C++ below Python).
TENSOR_CODE = re.compile(r"\[(torch|torch_xla|torch_tpu|{{ cookiecutter.package_name }})[.\]]")


def cli_env(src: Path = SRC) -> dict[str, str]:
    env = {**os.environ, **CHILD_ENV, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH")]))
    return env


def cli(*args: str, src: Path = SRC, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a fresh process (the XLA runtime starts once per process)."""
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", *args]
    return subprocess.run(
        command, env=cli_env(src), capture_output=True, text=True, timeout=600, **kwargs
    )


def cli_json(*args: str, accelerator_type: str = "v5e-8") -> str:
    """The `--json` output of a CLI command for a slice of `accelerator_type` (`plan`)."""
    done = cli(*args, "--accelerator-type", accelerator_type, "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def popen(*args: str, src: Path = SRC) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", *args]
    return subprocess.Popen(
        command, env=cli_env(src), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def preempt(
    args: tuple[str, ...], run_dir: Path, gate: Gate, src: Path, every_process: bool = False
) -> Any:
    """SIGTERM a run held at `gate` (the data of step `gate.steps + 1`); its summary, stopped.
    A run of several processes sends it on to them and says so; with `every_process` they
    get their own SIGTERM too, as they do when a VM goes down. Either way each has taken it
    before the gate opens.

    The run cannot train step `gate.steps + 1` before the gate is released, and the gate is
    released only once the signal was taken after the run logged step `gate.steps`: the run
    stops at the end of step `gate.steps` or `gate.steps + 1`, saved, exit 75, however loaded
    the machine (with log_every 1 the loop checks for SIGTERM after every step).
    """
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = run_dir.parent / f"{run_dir.name}.log"
    with log.open("w") as out:  # a file: a full pipe would stop the run before the gate
        process = subprocess.Popen(
            [sys.executable, "-m", "{{ cookiecutter.package_name }}", *args],
            env=cli_env(src), stdout=out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        gate.wait_reached(process, log)
        wait_for_line(process, log, f"step {gate.steps}/")  # it cannot get further
        signal_taken(process, signal.SIGTERM)
        workers = children(process.pid)
        if workers and not every_process:
            wait_for_line(process, log, "SIGTERM: sent on to")  # pending in each, or taken
        for pid in workers:
            (signal_taken if every_process else wait_taken)(pid, signal.SIGTERM)
        gate.release()
        process.wait(timeout=600)
    finally:
        gate.release()
        process.kill()  # a no-op once it has exited
    output = log.read_text()
    assert process.returncode == EXIT_PREEMPTED, output[-4000:]
    assert "stopped by SIGTERM" in output, output[-4000:]
    if not workers:  # one process: its last line is the stop and where it saved
        said = [line for line in output.splitlines() if not line.startswith(THREADS_LEFT)]
        assert said[-1].startswith("stopped by SIGTERM at step "), output[-4000:]
    assert threads_left(output) == set(), output[-4000:]
    stopped = json.loads((run_dir / "summary.json").read_text())
    if workers and not every_process:  # the launcher's count: its workers, nothing else
        assert f"SIGTERM: sent on to {stopped['devices']} processes" in output, output[-4000:]
    assert stopped["status"] == "preempted", stopped["status"]
    assert gate.steps <= stopped["steps"] <= gate.steps + 1, (stopped["steps"], gate.steps)
    return stopped


def preempt_then_resume(
    args: tuple[str, ...], run_dir: Path, gate: Gate, src: Path, every_process: bool = False
) -> Any:
    """`preempt` the run, then resume it with `--resume auto`; the resumed run's summary."""
    stopped = preempt(args, run_dir, gate, src, every_process)
    resumed = cli(*args, "--resume", "auto", src=src)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming at step {stopped['steps']}" in resumed.stdout
    return json.loads((run_dir / "summary.json").read_text())
