"""The `generate` command: completions of prompts from a run's checkpoint or the config's model,
on any layout, every process running the same program and the first writing the output."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from ..cli_common import fail, resolve_config
from .engine import DEFAULT_CHECK_EVERY, GenerationError, Shape
from .sampling import Sampling

CHECKPOINT_HELP = "A run's checkpoint, or its directory (the newest): its model and weights."
FIT_MARGIN = 0.1  # of HBM kept for what the estimate leaves out, as `plan`'s default margin
BUCKETS_HELP = "Prompt-length buckets, ascending: one compiled prefill each (64,256)."


@dataclass(frozen=True)
class Request:
    """What `generate` was asked, as every process of the job reads it."""

    texts: tuple[str, ...]
    prompts_file: str | None
    out: str | None
    shape: Shape
    sampling: Sampling
    stops: tuple[str, ...]
    ignore_eos: bool
    merge_lora: bool
    checkpoint: str | None
    accelerator_type: str = ""


def parse_buckets(text: str) -> tuple[int, ...]:
    """`64,256` as (64, 256); GenerationError for anything else."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise GenerationError(f"buckets {text!r} must be whole numbers: --buckets 64,256") from None


def generate_command(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="TOML or YAML file of config keys.")
    ] = None,
    checkpoint: Annotated[str | None, typer.Option(help=CHECKPOINT_HELP)] = None,
    prompt: Annotated[
        list[str] | None, typer.Option("--prompt", "-p", help="A prompt (repeat for more).")
    ] = None,
    prompts: Annotated[
        Path | None,
        typer.Option(help='Prompts: a .txt (one a line) or .jsonl ({"prompt"} or {"messages"}).'),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Write the completions (JSON lines) here, not stdout.")
    ] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens to generate at most.")] = 128,
    slots: Annotated[int, typer.Option(help="Prompts generated at once, over the job.")] = 8,
    buckets: Annotated[str, typer.Option(help=BUCKETS_HELP)] = "64,256",
    check_every: Annotated[
        int, typer.Option(help="Tokens between the host's checks for ends.")
    ] = DEFAULT_CHECK_EVERY,
    temperature: Annotated[float, typer.Option(help="0: greedy; else sampling.")] = 0.0,
    top_k: Annotated[int, typer.Option(help="Sample among the k likeliest (0: all).")] = 0,
    top_p: Annotated[float, typer.Option(help="Sample within this probability mass.")] = 1.0,
    seed: Annotated[int, typer.Option(help="The sampling seed.")] = 0,
    stop: Annotated[
        list[str] | None, typer.Option(help="A text that ends a completion (repeat).")
    ] = None,
    ignore_eos: Annotated[
        bool, typer.Option(help="Generate max_new_tokens whatever the end ids.")
    ] = False,
    merge_lora: Annotated[
        bool, typer.Option(help="Merge LoRA adapters into the base first (else kept apart).")
    ] = False,
    accelerator_type: Annotated[
        str, typer.Option(help="Refuse slots whose cache does not fit this TPU type (v5p-8).")
    ] = "",
    accelerator: Annotated[str | None, typer.Option(help="auto, tpu or cpu.")] = None,
    devices: Annotated[str | None, typer.Option(help="1, 8, all, or [core].")] = None,
    strategy: Annotated[str | None, typer.Option(help="The layout, as train takes it.")] = None,
    mesh: Annotated[str | None, typer.Option(help="The device mesh, as train takes it.")] = None,
    sets: Annotated[
        list[str] | None, typer.Option("--set", "-s", help="Override any config key: key=value.")
    ] = None,
) -> None:
    """Generate completions of prompts with the config's model or a run's checkpoint, in fixed
    shapes (one compiled prefill per bucket, one decode step), as JSON lines."""
    from ..core import RuntimeConfigError, launch
    from ..core.checkpoint_files import CheckpointError
    from ..training import plan_of
    from ..training.config import ConfigError

    if not prompt and prompts is None:
        fail("no prompts: give --prompt TEXT or --prompts FILE")
    try:
        shape = Shape(slots, parse_buckets(buckets), max_new_tokens, check_every)
        sampling = Sampling(temperature, top_k, top_p, seed)
        flags = {"accelerator": accelerator, "devices": devices, "strategy": strategy}
        flags["mesh"] = mesh
        cfg = run_config(config, sets, flags, checkpoint)
        request = Request(
            tuple(prompt or ()), str(prompts) if prompts else None, str(out) if out else None,
            shape, sampling, tuple(stop or ()), ignore_eos, merge_lora, checkpoint,
            accelerator_type,
        )  # fmt: skip
        plan = plan_of(cfg)
        summary = launch(run_generation, plan, args=(cfg, plan, request))
    except (GenerationError, ConfigError, CheckpointError, RuntimeConfigError, ValueError) as error:
        fail(str(error))
    if isinstance(summary, dict):
        typer.echo(summary_line(summary), err=True)


def run_config(
    config: Path | None, sets: list[str] | None, flags: dict[str, Any], checkpoint: str | None
) -> Any:
    """The config to run: the checkpoint's run's (its model), the file's and flags over it."""
    from ..training.checkpoint import read_config
    from ..training.config import build_config, parse_override
    from .model import check_same_model

    if checkpoint is None:
        return resolve_config(config, sets, flags)
    _, saved = read_config(checkpoint)
    saved = {k: v for k, v in saved.items() if k not in ("resume", "mesh", "strategy", "devices")}
    if config is not None:
        cfg = resolve_config(config, sets, flags)
        check_same_model(cfg, saved, checkpoint)
        return cfg
    overrides = {**saved, **dict(parse_override(item) for item in sets or [])}
    overrides.update({k: v for k, v in flags.items() if v is not None})
    return build_config(None, overrides)


def run_generation(cfg: Any, plan: Any, request: Request) -> dict[str, Any] | None:
    """In every process: the model, the engine, the completions; the first writes them."""
    from .engine import Engine
    from .model import load_model
    from .prompts import read_prompts, write_completions

    loaded = load_model(cfg, plan, request.checkpoint, request.merge_lora)
    path = Path(request.prompts_file) if request.prompts_file else None
    prompts = read_prompts(request.texts, path, loaded.tokenizer)
    check_fits(loaded.model, plan.strategy, request)
    stop_ids = [] if request.ignore_eos else end_ids(loaded.model, loaded.tokenizer)
    engine = Engine(
        loaded.model, loaded.tokenizer, plan.strategy, request.shape, request.sampling,
        stop_ids, request.stops,
    )  # fmt: skip
    for prompt in prompts:  # every prompt fits, or nothing runs
        request.shape.bucket(len(prompt.ids))
    completions = engine.generate([p.ids for p in prompts])
    if not plan.strategy.is_master():
        return None
    out = Path(request.out) if request.out else None
    text = write_completions(out, prompts, completions)
    if out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    summary = {**asdict(engine.timing), "tokens_per_s": engine.timing.tokens_per_s}
    summary["prompts"] = len(prompts)
    if not plan.strategy.returns_result():
        typer.echo(summary_line(summary), err=True)
    return summary


def check_fits(model: Any, strategy: Any, request: Request) -> None:
    """Refuse slots whose cache and the model's parameters, per device, exceed the usable HBM
    of the accelerator type asked for (or of this TPU); off a TPU with none asked, no check."""
    from .. import hf
    from ..core import memory, runtime
    from ..planning.estimate import Accelerator
    from .engine import cache_bytes_per_device

    kind = request.accelerator_type or (runtime.accelerator_type() if runtime.tpu_present() else "")
    if not kind:
        return
    axes = strategy.mesh_axes()
    shards = strategy.data_layout()[0] * strategy.local_batch_shards()  # of the batch, all
    value_bytes = next(p.element_size() for p in model.parameters() if p.is_floating_point())
    config = hf.unwrap(model).config
    shape = request.shape
    cache = cache_bytes_per_device(
        config, shape.slots, shape.max_length, shards, axes.get("tensor", 1), value_bytes
    )
    held = memory.state_memory(model, None)["param_bytes_per_device"]
    accelerator = Accelerator.parse(kind)
    usable = int(accelerator.hbm_bytes_per_device * (1 - FIT_MARGIN))
    if cache + held > usable:
        raise GenerationError(
            f"{shape.slots} slots of {shape.max_length} tokens do not fit {kind}: the cache takes "
            f"{cache / 2**30:.2f} GiB and the parameters {held / 2**30:.2f} GiB on each device, "
            f"over the {usable / 2**30:.2f} GiB usable of its HBM (`plan --slots` sizes it): "
            "use fewer --slots, shorter --buckets or --max-new-tokens, or a larger mesh"
        )


def end_ids(model: Any, tokenizer: Any) -> list[int]:
    """The ids that end a completion: the tokenizer's end of sequence and the model's."""
    from .. import hf

    found: list[Any] = [getattr(tokenizer, "eos_token_id", None)]
    inner = hf.unwrap(model)
    generation = getattr(inner, "generation_config", None)
    value = getattr(generation, "eos_token_id", None)
    found += value if isinstance(value, list) else [value]
    return sorted({int(i) for i in found if isinstance(i, int)})


def summary_line(summary: dict[str, Any]) -> str:
    """Time to first token and tokens/s, in one line."""
    return (
        f"generated {summary['generated']} tokens for {summary['prompts']} prompt(s) in "
        f"{summary['batches']} batch(es): first token {summary['first_token_s'] * 1000:.0f} ms, "
        f"{summary['tokens_per_s']:.1f} tokens/s after it, {summary['reads']} host read(s)"
    )
