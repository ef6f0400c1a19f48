"""`plan`: will this run fit that TPU slice? Asked on a laptop, before renting it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

DEFAULT_ACCELERATOR = "{{ cookiecutter.accelerator_type }}"  # the project's own
ACCELERATOR_HELP = "TPU slice: v5litepod-8 (or v5e-8), v5p-64, v6e-256, v4-32, ..."
MESH_HELP = (
    "fsdp=8, fsdp=4,tensor=2, data=2,fsdp=2,tensor=2, fsdp=2,expert=4, fsdp=4,context=2 "
    "(default: fsdp over every device)."
)
HF_CONFIG_HELP = "Plan a Hugging Face decoder from its config: a cached name or a directory."
ARCHITECTURE_HELP = "Plan a Hugging Face decoder of this model type (llama, qwen2, ...) and --size."
SIZE_HELP = (
    "The shape for --architecture: a known size (llama: 8b and 70b, Llama 3's, 405b, Llama "
    "3.1's; mixtral: 8x7b; llama4_text: scout, Llama 4 Scout's text model), "
    "FIELD=N pairs (vocab, dim, layers, heads, kv_heads, mlp_dim, positions, experts, "
    "experts_per_token), or both: 8b,layers=16."
)
LEGACY_PRECISIONS = ("bf16-env", "bf16-env-downcast")


@dataclass(frozen=True)
class Request:
    """What `plan` was asked, before anything is checked."""

    config_file: Path | None
    sets: list[str]
    hf_config: str | None
    architecture: str | None
    size: str | None
    accelerator_type: str
    mesh: str | None
    batch_size: int | None
    global_batch: int | None
    seq_len: int | None
    precision: str | None
    optimizer: str | None
    margin: float
    slots: int | None = None  # generation: prompts at once, and their cache's length
    max_length: int | None = None


def plan(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="TOML or YAML file of config keys.")
    ] = None,
    sets: Annotated[
        list[str] | None, typer.Option("--set", "-s", help="Override any config key: key=value.")
    ] = None,
    hf_config: Annotated[str | None, typer.Option(help=HF_CONFIG_HELP)] = None,
    architecture: Annotated[str | None, typer.Option(help=ARCHITECTURE_HELP)] = None,
    size: Annotated[str | None, typer.Option(help=SIZE_HELP)] = None,
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
        float,
        typer.Option(
            help="Share of HBM (and of host RAM) kept free for what the estimate leaves out."
        ),
    ] = 0.1,
    slots: Annotated[
        int | None, typer.Option(help="Generation: prompts at once, for the key/value cache.")
    ] = None,
    max_length: Annotated[
        int | None, typer.Option(help="Generation: a slot's tokens, prompt and new ones.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """Estimate the per-device memory of a run on a TPU slice, and the smallest slice it fits;
    and the host RAM each host needs to load the model and to export it.

    The model is built on the meta device (no memory, no download, no TPU, no XLA runtime).
    """
    from ..cli_common import fail
    from ..training.config import ConfigError

    request = Request(
        config, sets or [], hf_config, architecture, size, accelerator_type, mesh, batch_size,
        global_batch, seq_len, precision, optimizer, margin, slots, max_length,
    )  # fmt: skip
    try:
        result = make_plan(request)
    except (ConfigError, ValueError, OSError) as error:
        fail(str(error))
    from .report import as_json as json_report
    from .report import print_plan

    if as_json:
        typer.echo(json.dumps(json_report(result), indent=2))
    else:
        print_plan(result)


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


def _check_model_source(request: Request) -> None:
    from .estimate import PlanError

    if request.hf_config is not None and request.architecture is not None:
        raise PlanError("give --hf-config or --architecture, not both")
    if request.size is not None and request.architecture is None:
        raise PlanError("--size is the shape of an --architecture: give both")
    if request.architecture is not None and request.size is None:
        raise PlanError(
            f"--architecture {request.architecture} needs --size (a known size, e.g. 8b or 70b "
            "for llama, or vocab=N,dim=N,layers=N,heads=N)"
        )
    option = "--hf-config" if request.hf_config is not None else "--architecture"
    if (request.hf_config or request.architecture) is not None and request.seq_len is None:
        raise PlanError(f"{option} needs --seq-len: a model's shape says nothing of the batch's")


def make_plan(request: Request) -> Any:
    """Check every input, then build the model and estimate (errors: ValueError subclasses)."""
    from ..core.sharding import parse_mesh
    from ..training.config import build_config, parse_override
    from .estimate import Accelerator, BatchSize, PlanError, Planner, check_batch, check_mesh
    from .host_memory import host_memory
    from .report import Plan
    from .workload import from_architecture, from_hf_config, from_task

    if not 0 <= request.margin < 1:
        raise PlanError(f"--margin is a share of HBM, from 0 to below 1, got {request.margin}")
    if request.batch_size is not None and request.global_batch is not None:
        raise PlanError("give --batch-size (per device) or --global-batch, not both")
    if request.global_batch is not None and request.global_batch < 1:
        raise PlanError(f"--global-batch must be at least 1, got {request.global_batch}")
    _check_model_source(request)
    accelerator = Accelerator.parse(request.accelerator_type)
    decoder_only = request.hf_config is not None or request.architecture is not None
    overrides: dict[str, Any] = dict(parse_override(item) for item in request.sets)
    flags = {
        "precision": request.precision,
        "optimizer": request.optimizer,
        "batch_size": request.batch_size,
    }
    overrides.update({key: value for key, value in flags.items() if value is not None})
    if request.seq_len is not None and not decoder_only:
        overrides["task_options.seq_len"] = request.seq_len
    cfg = build_config(request.config_file, overrides)
    if cfg.precision in LEGACY_PRECISIONS:
        raise PlanError(
            f"precision {cfg.precision!r} keeps every float in bf16 on the device: "
            "plan it as --precision bf16-true"
        )
    shape = parse_mesh(request.mesh or cfg.mesh) or (("fsdp", accelerator.devices),)
    check_mesh(shape, accelerator)
    batch = BatchSize(cfg.batch_size, request.global_batch, cfg.eval_batch_size or None)
    check_batch(shape, batch.of(shape))

    seq_len = request.seq_len or 0
    with _torch_xla_unused():
        if request.architecture is not None:
            workload = from_architecture(request.architecture, request.size or "", cfg, seq_len)
        elif request.hf_config is not None:
            workload = from_hf_config(request.hf_config, cfg, seq_len)
        else:
            workload = from_task(cfg)
        planner = Planner(workload)
        estimate = planner.estimate(shape, batch)
        usable = accelerator.hbm_bytes_per_device * (1 - request.margin)
        smallest = {
            checkpointed: planner.smallest(accelerator.generation, batch, checkpointed, usable)
            for checkpointed in (False, True)
        }
        proposed = {
            checkpointed: planner.fitting(
                accelerator.generation, accelerator.size, batch, checkpointed, usable
            )
            for checkpointed in (False, True)
        }
        generation = generation_plan(request, workload, estimate, shape, usable)
    return Plan(
        model=workload.task.name,
        parameters=workload.describe(),
        parameter_count=workload.counts()["total"],
        active_parameter_count=workload.counts().get("active"),
        blocks=len(workload.blocks),
        precision=cfg.precision,
        optimizer=cfg.optimizer,
        tokens_per_sample=getattr(workload.task, "tokens_per_sample", None) or request.seq_len,
        accelerator=accelerator,
        margin=request.margin,
        estimate=estimate,
        smallest=smallest,
        proposed=proposed,
        host=host_memory(workload, accelerator, request.margin),
        generation=generation,
    )


def generation_plan(
    request: Request, workload: Any, estimate: Any, shape: Any, usable: float
) -> Any:
    """The key/value cache `generate --slots --max-new-tokens` allocates, per device, beside
    the parameters as the mesh holds them (None when no --slots was asked)."""
    from .. import hf
    from ..core.sharding import BATCH_AXES
    from ..generation.engine import cache_bytes_per_device
    from .estimate import PlanError
    from .report import GenerationPlan

    if request.slots is None and request.max_length is None:
        return None
    if not request.slots or not request.max_length or request.slots < 1 or request.max_length < 1:
        raise PlanError("generation needs --slots N and --max-length N, both at least 1")
    inner = hf.unwrap(workload.model)
    if inner is None:
        raise PlanError("--slots plans a transformers decoder's key/value cache: the task has none")
    axes = dict(shape)
    shards = 1
    for axis, size in shape:
        shards *= size if axis in BATCH_AXES else 1
    value_bytes = 2 if workload.config.precision == "bf16-true" else 4
    slots, length = request.slots, request.max_length
    tensor = axes.get("tensor", 1)
    cache = cache_bytes_per_device(inner.config, slots, length, shards, tensor, value_bytes)
    return GenerationPlan(slots, length, cache, estimate.parameters, int(usable))
