"""`plan`: will this run fit that TPU slice? Asked on a laptop, before renting it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

DEFAULT_ACCELERATOR = "{{ cookiecutter.accelerator_type }}"  # the project's own
ACCELERATOR_HELP = "TPU slice: v5litepod-8 (or v5e-8), v5p-64, v6e-256, v4-32, ..."
MESH_HELP = "fsdp=8, fsdp=4,tensor=2, data=2,fsdp=2,tensor=2 (default: fsdp over every device)."
HF_CONFIG_HELP = "Plan a Hugging Face model from its config: a cached name or a directory."
LEGACY_PRECISIONS = ("bf16-env", "bf16-env-downcast")


def plan(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="TOML or YAML file of config keys.")
    ] = None,
    sets: Annotated[
        list[str] | None, typer.Option("--set", "-s", help="Override any config key: key=value.")
    ] = None,
    hf_config: Annotated[str | None, typer.Option(help=HF_CONFIG_HELP)] = None,
    accelerator_type: Annotated[str, typer.Option(help=ACCELERATOR_HELP)] = DEFAULT_ACCELERATOR,
    mesh: Annotated[str | None, typer.Option(help=MESH_HELP)] = None,
    batch_size: Annotated[
        int | None, typer.Option(help="Samples per device, as train takes it.")
    ] = None,
    global_batch: Annotated[
        int | None, typer.Option(help="Samples per step over every device (instead).")
    ] = None,
    seq_len: Annotated[
        int | None, typer.Option(help="Tokens per sample (the task's seq_len option).")
    ] = None,
    precision: Annotated[str | None, typer.Option(help="32-true, bf16-mixed or bf16-true.")] = None,
    optimizer: Annotated[str | None, typer.Option(help="adamw, sgd, rmsprop or adafactor.")] = None,
    margin: Annotated[
        float, typer.Option(help="Share of HBM kept free for what the estimate leaves out.")
    ] = 0.1,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """Estimate the per-device memory of a run on a TPU slice, and the smallest slice it fits.

    The model is built on the meta device (no memory, no download, no TPU, no XLA runtime).
    """
    from ..cli import fail  # the CLI's one-line error (cli.py imports this module)
    from ..training.config import ConfigError

    try:
        result = _make_plan(
            config, sets or [], hf_config, accelerator_type, mesh, batch_size, global_batch,
            seq_len, precision, optimizer, margin,
        )  # fmt: skip
    except (ConfigError, ValueError, OSError) as error:
        fail(str(error))
    from .report import as_json as json_report
    from .report import as_text

    typer.echo(json.dumps(json_report(result), indent=2) if as_json else as_text(result))


@contextmanager
def _torch_xla_unused() -> Iterator[None]:
    """Tell transformers and accelerate not to use torch_xla (`USE_TORCH_XLA=0`): installed,
    they import it to look for a TPU (and the runtime prints its notes), and nothing a plan
    does needs it. Each reads the setting once, when its modules load, which may happen while
    the plan runs; the command runs in a process of its own, so it stays in effect there."""
    saved = os.environ.get("USE_TORCH_XLA")
    os.environ["USE_TORCH_XLA"] = "0"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["USE_TORCH_XLA"]
        else:
            os.environ["USE_TORCH_XLA"] = saved


def _make_plan(
    config_file: Path | None,
    sets: list[str],
    hf_config: str | None,
    accelerator_type: str,
    mesh: str | None,
    batch_size: int | None,
    global_batch: int | None,
    seq_len: int | None,
    precision: str | None,
    optimizer: str | None,
    margin: float,
) -> Any:
    """Check every input, then build the model and estimate (errors: ValueError subclasses)."""
    from ..core.sharding import parse_mesh
    from ..training.config import build_config, parse_override
    from .estimate import Accelerator, BatchSize, PlanError, Planner, check_batch, check_mesh
    from .report import Plan
    from .workload import from_hf_config, from_task

    if not 0 <= margin < 1:
        raise PlanError(f"--margin is a share of HBM, from 0 to below 1, got {margin}")
    if batch_size is not None and global_batch is not None:
        raise PlanError("give --batch-size (per device) or --global-batch, not both")
    if hf_config is not None and seq_len is None:
        raise PlanError("--hf-config needs --seq-len: a config says nothing of the batch's length")
    accelerator = Accelerator.parse(accelerator_type)
    overrides: dict[str, Any] = dict(parse_override(item) for item in sets)
    flags = {"precision": precision, "optimizer": optimizer, "batch_size": batch_size}
    overrides.update({key: value for key, value in flags.items() if value is not None})
    if seq_len is not None and hf_config is None:
        overrides["task_options.seq_len"] = seq_len
    cfg = build_config(config_file, overrides)
    if cfg.precision in LEGACY_PRECISIONS:
        raise PlanError(
            f"precision {cfg.precision!r} keeps every float in bf16 on the device: "
            "plan it as --precision bf16-true"
        )
    shape = parse_mesh(mesh or cfg.mesh) or (("fsdp", accelerator.devices),)
    check_mesh(shape, accelerator)
    batch = BatchSize(per_device=cfg.batch_size, global_batch=global_batch)
    check_batch(shape, batch.of(accelerator.devices))
    if global_batch is not None and global_batch < 1:
        raise PlanError(f"--global-batch must be at least 1, got {global_batch}")

    with _torch_xla_unused():
        workload = from_hf_config(hf_config, cfg, seq_len or 0) if hf_config else from_task(cfg)
        planner = Planner(workload)
        estimate = planner.estimate(shape, batch.of(accelerator.devices))
        usable = accelerator.hbm_bytes_per_device * (1 - margin)
        smallest = {
            checkpointed: planner.smallest(accelerator.generation, batch, checkpointed, usable)
            for checkpointed in (False, True)
        }
    return Plan(
        model=workload.task.name,
        parameters=workload.describe(),
        blocks=len(workload.blocks),
        precision=cfg.precision,
        optimizer=cfg.optimizer,
        tokens_per_sample=getattr(workload.task, "tokens_per_sample", None) or seq_len,
        accelerator=accelerator,
        margin=margin,
        estimate=estimate,
        smallest=smallest,
    )
