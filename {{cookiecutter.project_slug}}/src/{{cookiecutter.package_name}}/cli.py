"""Command line: {% if cookiecutter.example_task != "vision" %}prepare, {% endif %}train, eval, plan, profile, debug, doctor, goodput, pod, spot,
config show.

Installed as `{{ cookiecutter.project_slug }}`; also `python -m {{ cookiecutter.package_name }}`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from .cli_common import (
    EXIT_CHECKPOINT,
    EXIT_DIVERGED,
    EXIT_PREEMPTED,
    EXIT_USAGE,
    fail,
    resolve_config,
)
from .core.runtime import RuntimeConfigError
{%- if cookiecutter.example_task != "vision" %}
from .data.cli import prepare_command
from .generation.cli import generate_command
{%- endif %}
from .goodput import cli as goodput_cli
from .goodput.timeline import record_failure
from .planning.cli import plan
from .pod.cli import pod_app
from .spot.cli import spot_app

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
config_app = typer.Typer(no_args_is_help=True, help="Inspect the resolved configuration.")
app.add_typer(config_app, name="config")
app.add_typer(pod_app, name="pod")
app.add_typer(spot_app, name="spot")
{%- if cookiecutter.example_task != "vision" %}
app.command("prepare")(prepare_command)
app.command("generate")(generate_command)
{%- endif %}
app.command()(plan)
app.command("goodput")(goodput_cli.goodput_command)

ConfigFile = Annotated[
    Path | None, typer.Option("--config", "-c", help="TOML or YAML file of config keys.")
]
{%- if cookiecutter.backend == "torch_tpu" %}
STRATEGY_HELP = "auto, single, ddp or fsdp."
MESH_HELP = "fsdp device mesh: fsdp=8, data=2,fsdp=4, fsdp=4,tensor=2."
{%- else %}
STRATEGY_HELP = "auto, single, ddp, spmd or fsdp."
MESH_HELP = "spmd/fsdp device mesh: fsdp=8, data=2,fsdp=4."
{%- endif %}
RESUME_HELP = "auto (if a checkpoint exists, else fresh), latest, or a checkpoint path/URL."
CHECKPOINT_HELP = "A checkpoint, or a checkpoint directory (its newest); a path or URL."
Sets = Annotated[
    list[str] | None, typer.Option("--set", "-s", help="Override any config key: key=value.")
]


@app.command()
def train(
    config: ConfigFile = None,
    accelerator: Annotated[str | None, typer.Option(help="auto, tpu or cpu.")] = None,
    devices: Annotated[str | None, typer.Option(help="1, 8, all, or one core id like [5].")] = None,
    strategy: Annotated[str | None, typer.Option(help=STRATEGY_HELP)] = None,
    mesh: Annotated[str | None, typer.Option(help=MESH_HELP)] = None,
    precision: Annotated[
        str | None, typer.Option(help="32-true, bf16-mixed, bf16-true, ...")
    ] = None,
    max_epochs: Annotated[int | None, typer.Option(help="Epochs to train.")] = None,
    max_steps: Annotated[
        int | None, typer.Option(help="Optimizer steps (wins over epochs).")
    ] = None,
    batch_size: Annotated[int | None, typer.Option(help="Samples per device per step.")] = None,
    lr: Annotated[float | None, typer.Option(help="Peak learning rate.")] = None,
    log_every: Annotated[int | None, typer.Option(help="Log every N steps.")] = None,
    eval_every: Annotated[
        int | None, typer.Option(help="Evaluate every N steps (0: at end).")
    ] = None,
    checkpoint_every: Annotated[int | None, typer.Option(help="Checkpoint every N steps.")] = None,
    seed: Annotated[int | None, typer.Option(help="Random seed.")] = None,
    run_dir: Annotated[str | None, typer.Option(help="Where logs and the summary go.")] = None,
    checkpoint_dir: Annotated[
        str | None, typer.Option(help="Where checkpoints go: a path or URL (gs://...).")
    ] = None,
    data: Annotated[
        str | None, typer.Option(help="A prepared dataset (path or gs://), text, or hf:NAME.")
    ] = None,
    resume: Annotated[str | None, typer.Option(help=RESUME_HELP)] = None,
    sets: Sets = None,
) -> None:
    """Train the task's model and print its eval metrics as JSON; stopped by SIGTERM, it saves,
    says where and how to continue, and exits 75."""
    flags = {k: v for k, v in locals().items() if k not in ("config", "sets")}
    cfg = resolve_config(config, sets, flags)
    if goodput_cli.finished_before(cfg):
        return  # a relaunch of a run that completed: nothing to train
    summary = _run(cfg)
    goodput_cli.end_of_run(summary)
    if summary["status"] == "preempted":  # no final evaluation: its last line says what to do
        typer.echo(
            f"stopped by SIGTERM at step {summary['steps']}, saved to {summary['checkpoint']}; "
            "the same command with --resume auto continues it"
        )
        raise typer.Exit(EXIT_PREEMPTED)  # not done: a supervisor must run it again
    typer.echo(json.dumps(summary["eval"]))


def _run(cfg: Any) -> dict[str, Any]:
    """Launch a run; every expected failure becomes one line and its exit code."""
    from .core.checkpoint_files import CheckpointError, CheckpointWriteError
    from .training import train as run_training

    try:
        writable(cfg.run_dir)
        summary: dict[str, Any] = run_training(cfg)
    except CheckpointWriteError as error:
        _failed(f"{error}; the last whole checkpoint is untouched", EXIT_CHECKPOINT)
    except (RuntimeConfigError, CheckpointError, ValueError) as error:
        _failed(str(error))
    except typer.Exit:
        raise
    except Exception as error:  # a bug: its traceback follows, its attempt is on record
        record_failure(f"{type(error).__name__}: {str(error).strip()[:300]}", 1)
        raise
    if summary["status"] == "diverged":
        last = summary["checkpoint"]
        advice = (
            f"last good checkpoint: {last} (resume from it with a lower lr: --resume {last})"
            if last
            else "no checkpoint was written before it: lower lr and train again"
        )
        fail(
            f"training diverged: the loss or the weights are NaN or infinite at step "
            f"{summary['diverged_at']}, so nothing was saved from them; {advice}",
            EXIT_DIVERGED,
        )
    return summary


def _failed(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Fail in one line, and give the attempt that failed its incident line."""
    record_failure(message, code)
    fail(message, code)


def writable(folder: str) -> None:
    """Refuse a run directory that cannot be created or written, before anything starts."""
    import os

    existing = Path(folder).absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        fail(f"cannot write to run_dir {folder!r}: {str(existing)!r} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        fail(f"cannot write to run_dir {folder!r}: {str(existing)!r} is not writable")


@app.command()
def profile(
    config: ConfigFile = None,
    steps: Annotated[int, typer.Option(help="Training steps to capture.")] = 20,
    max_steps: Annotated[int, typer.Option(help="Length of the run (warm-up included).")] = 60,
{%- if cookiecutter.backend == "torch_xla" %}
    port: Annotated[int, typer.Option(help="Profiler server port.")] = 9012,
{%- endif %}
    run_dir: Annotated[str, typer.Option(help="Where the trace goes.")] = "runs/profile",
    sets: Sets = None,
) -> None:
    """Train briefly and capture a profiler trace into RUN_DIR/profile for TensorBoard."""
    flags = {
        "profile_steps": steps,
{%- if cookiecutter.backend == "torch_xla" %}
        "profile_port": port,
{%- endif %}
        "max_steps": max_steps,
        "run_dir": run_dir,
        "metrics_report": True,
    }
    summary = _run(resolve_config(config, sets, flags))
    captured = summary.get("profile") or {}
    if not captured.get("traces"):
        fail(f"no trace captured in {run_dir}: raise --max-steps so the run outlasts warm-up")
    typer.echo(f"trace: {captured['traces'][0]}")
    typer.echo(f"view it with: tensorboard --logdir {run_dir}/profile")
    if captured["device"] != "TPU":
        typer.echo("note: off-TPU the trace holds host and {% if cookiecutter.backend == "torch_tpu" %}CPU{% else %}XLA:CPU{% endif %} activity only;")
        typer.echo("      TPU timelines need a TPU")


@app.command()
def debug(
    config: ConfigFile = None,
    max_steps: Annotated[int, typer.Option(help="Length of the run.")] = 30,
    run_dir: Annotated[str, typer.Option(help="Where the report goes.")] = "runs/debug",
    sets: Sets = None,
) -> None:
{%- if cookiecutter.backend == "torch_tpu" %}
    """Train briefly, then print and save torch.compile's counters (graphs, graph breaks,
    device reads) with a diagnosis."""
{%- else %}
    """Train briefly, then print and save torch_xla's metrics report with a diagnosis."""
{%- endif %}
    flags = {"max_steps": max_steps, "run_dir": run_dir, "metrics_report": True}
    summary = _run(resolve_config(config, sets, flags))
    typer.echo(Path(summary["metrics_report"]).read_text())
    typer.echo(f"saved: {summary['metrics_report']}")


@app.command("eval")
def evaluate(
    checkpoint: Annotated[str | None, typer.Option(help=CHECKPOINT_HELP)] = None,
    accelerator: Annotated[str | None, typer.Option(help="auto, tpu or cpu.")] = None,
    devices: Annotated[str | None, typer.Option(help="1, 8, all, or [core].")] = None,
    strategy: Annotated[str | None, typer.Option(help=STRATEGY_HELP)] = None,
    mesh: Annotated[str | None, typer.Option(help=MESH_HELP)] = None,
    data: Annotated[str | None, typer.Option(help="Evaluate on other data.")] = None,
{%- if cookiecutter.example_task != "vision" %}
    tasks: Annotated[
        str | None,
        typer.Option(help="lm-evaluation-harness tasks instead of the loss: arc_easy,gsm8k."),
    ] = None,
    include_path: Annotated[
        str | None, typer.Option(help="A folder (or gs://) of your own task YAML files.")
    ] = None,
    limit: Annotated[
        float | None, typer.Option(help="Samples per task (a share if below 1), lm-eval's limit.")
    ] = None,
    num_fewshot: Annotated[int | None, typer.Option(help="Few-shot examples per prompt.")] = None,
    log_samples: Annotated[
        bool, typer.Option(help="Also write each task's per-sample records.")
    ] = False,
    out: Annotated[str, typer.Option(help="Where lm-eval's results go.")] = "runs/eval",
    buckets: Annotated[
        str, typer.Option(help="Sequence-length buckets, ascending: one compiled step each.")
    ] = "256,1024",
    slots: Annotated[int, typer.Option(help="Sequences a forward, over the job.")] = 8,
    config: ConfigFile = None,
    sets: Sets = None,
{%- endif %}
) -> None:
    """Evaluate a checkpoint (resharded to any strategy) and print the metrics as JSON{% if cookiecutter.example_task != "vision" %}; with
    --tasks, run lm-evaluation-harness tasks on it or on the config's model{% endif %}."""
    from .core import launch
    from .core.checkpoint_files import CheckpointError
    from .training import plan_of
    from .training.checkpoint import read_config
    from .training.config import ConfigError, build_config
    from .training.evaluation import evaluate_checkpoint

    flags = {"accelerator": accelerator, "devices": devices, "strategy": strategy}
    flags.update({"mesh": mesh, "data": data})
{%- if cookiecutter.example_task != "vision" %}
    if tasks is not None:
        _benchmarks(checkpoint, config, sets, flags, tasks, include_path, limit, num_fewshot,
                    log_samples, out, buckets, slots)  # fmt: skip
        return
{%- endif %}
    if checkpoint is None:
        fail("eval needs --checkpoint (a run's checkpoint or its directory){% if cookiecutter.example_task != "vision" %}, or --tasks{% endif %}")
    try:
        path, saved = read_config(checkpoint)
        saved = {k: v for k, v in saved.items() if k != "resume"}
        if strategy is not None and mesh is None:
            saved["mesh"] = ""  # the saved mesh belongs to the saved strategy
        saved.update({k: v for k, v in flags.items() if v is not None})
        cfg = build_config(None, saved)
        plan = plan_of(cfg)
        if not plan.strategy.returns_result():
            fail("eval returns its metrics from one process: use --strategy spmd or --devices 1")
        metrics = launch(evaluate_checkpoint, plan, args=(cfg, plan, path))
    except (CheckpointError, ConfigError, RuntimeConfigError, ValueError) as error:
        fail(str(error))
    typer.echo(json.dumps(metrics))
{%- if cookiecutter.example_task != "vision" %}


def _benchmarks(
    checkpoint: str | None, config: Path | None, sets: list[str] | None,
    flags: dict[str, Any], tasks: str, include_path: str | None, limit: float | None,
    num_fewshot: int | None, log_samples: bool, out: str, buckets: str, slots: int,
) -> None:  # fmt: skip
    """`eval --tasks`: lm-eval on the checkpoint's model, or the config's."""
    from .core import launch
    from .core.checkpoint_files import CheckpointError
    from .generation.cli import parse_buckets, run_config
    from .harness.cli import Benchmarks, check, parse_tasks, run_benchmarks
    from .training import plan_of
    from .training.config import ConfigError

    try:
        benchmarks = Benchmarks(
            parse_tasks(tasks), include_path, limit, num_fewshot, log_samples, out,
            parse_buckets(buckets), slots, checkpoint,
        )  # fmt: skip
        check(benchmarks)
        cfg = run_config(config, sets, flags, checkpoint)
        plan = plan_of(cfg)
        found = launch(run_benchmarks, plan, args=(cfg, plan, benchmarks))
    except (CheckpointError, ConfigError, RuntimeConfigError, ValueError) as error:
        fail(str(error))
    if isinstance(found, dict):
        typer.echo(json.dumps(found))
{%- endif %}


@app.command("export")
def export(
    checkpoint: Annotated[str, typer.Option(help=CHECKPOINT_HELP)],
    out: Annotated[Path, typer.Option(help="safetensors: the file to write; hf: a new directory.")],
    format: Annotated[
        str, typer.Option(help="safetensors (this project's loader) or hf (transformers).")
    ] = "safetensors",
    adapter_only: Annotated[
        bool, typer.Option(help="hf, LoRA runs: the adapter alone, for peft (else merged).")
    ] = False,
    max_shard_size: Annotated[
        str, typer.Option(help="hf: weights above this split into indexed shards.")
    ] = "5GB",
) -> None:
    """Write a checkpoint's weights for plain torch on a CPU, or as a Hugging Face model."""
    from .core.checkpoint_files import CheckpointError
    from .training.config import ConfigError
    from .training.export import export_checkpoint

    try:
        written = export_checkpoint(checkpoint, out, format, adapter_only, max_shard_size)
    except (CheckpointError, ConfigError, ValueError, OSError) as error:
        fail(str(error))
    typer.echo(
        f"exported {written['checkpoint']} -> {out} ({written['parameters']} parameters in "
        f"{len(written['files'])} file(s); largest tensor held: {written['largest_held_bytes']} "
        "bytes)"
    )


@app.command()
def doctor(
    config: ConfigFile = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the checks as JSON.")] = False,
) -> None:
    """Check the torch/{% if cookiecutter.backend == "torch_tpu" %}TorchTPU{% else %}torch_xla{% endif %} setup of this host; print the fix of each problem."""
    import os

    from .core.doctor import run_checks
    from .core.host_checks import report

    cfg = resolve_config(config, None, {})
    found = run_checks(os.environ, cfg.compile_cache, Path(cfg.run_dir) / "summary.json")
    result = report(found)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        for check in found:
            typer.echo(f"{check.status:<6} {check.name:<18} {check.detail}")
            if check.fix:
                typer.echo(f"{'':<6} {'':<18} fix: {check.fix}")
        typer.echo(f"doctor: {result['errors']} error(s), {result['warnings']} warning(s)")
    raise typer.Exit(1 if result["errors"] else 0)


@config_app.command("show")
def config_show(config: ConfigFile = None, sets: Sets = None) -> None:
    """Print the configuration a run would use (defaults < file < --set)."""
    cfg = resolve_config(config, sets, {})
    typer.echo(json.dumps(cfg.to_dict(), indent=2))


def main() -> None:
    """Console-script entry point."""
    app(prog_name="{{ cookiecutter.project_slug }}")


if __name__ == "__main__":
    main()
