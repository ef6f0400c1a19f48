"""The model a run trains: the task's model, seeded, adapted, and cast, the same way for
training, evaluation and export."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .. import hf
from ..core import Precision, RuntimeConfigError, Strategy, ops
from ..core.layers import enable_scan
from ..core.materialize import Index, Source, Unfilled, fill_whole, whole
from ..core.sharding import Rule, parse_rules
from ..tasks import Task
from ..weights.init import NotInitializable, SeededInit
from ..weights.meta import blocker, parameters_on_meta
from .config import ConfigError, TrainConfig

if TYPE_CHECKING:
    from ..hf.moe import MoeSettings


@dataclass
class Built:
    """The model a run trains, and where its values come from: a model built on the meta
    device gets them from `source` where the strategy places it; None: it is whole on the
    host already (built as a plain constructor builds it, `note` says why)."""

    model: nn.Module
    source: Source | None = None
    note: str = ""


def objective_of(cfg: TrainConfig, task: Task) -> Task:
    """The task, or its model under another objective (`objective = "dpo"`)."""
    if cfg.objective == "causal-lm":
        return task
    from ..alignment.objective import of_run

    return of_run(cfg, task)  # type: ignore[no-any-return]


def build(task: Task, config: TrainConfig, model: nn.Module | None = None) -> Built:
    """The task's model as this config trains it, built without memory where it can be.

    On the meta device, adapted as `build_model` adapts it; its values come from the
    task's pretrained weights (read by shard) and, for the rest, its own initialization
    seeded per module (`weights/init.py`). A scanned model is filled whole on the host from
    the same initialization, then stacked. A model given, or one whose constructor computes
    on its parameters, is built whole on the host (`build_model`).
    """
    if model is not None:
        return Built(build_model(task, config, model))
    try:
        with parameters_on_meta():
            meta = task.build_model()
        reason = blocker(meta)
        if reason is None and config.scan_layers:  # stacked from whole blocks, same values
            fill_whole(meta, SeededInit(meta, config.seed), "cpu")
            return Built(adapt(meta, config), note=WHOLE + "scan_layers stacks its blocks")
        if reason is None:
            pretrained = open_pretrained_weights(task, meta)  # checked against the plain model
            meta = adapt(meta, config)
            return Built(meta, weights_source(meta, config, pretrained))
    except NotInitializable as error:
        reason = str(error)
    return Built(build_model(task, config), note=f"{WHOLE}{reason}")


def read_over(built: Built) -> Source | None:
    """The source for a model a checkpoint's weights are read into next: memory alone,
    unless the checkpoint holds only LoRA adapters (the base still comes from the task)."""
    from ..hf.lora import is_lora

    if built.source is None or is_lora(built.model):
        return built.source
    return Unfilled()


# The start of the one line a run prints when it builds its model whole on the host.
WHOLE = "model: built whole on the host, not on the meta device: "


def open_pretrained_weights(task: Task, model: nn.Module) -> Any:
    """The task's pretrained safetensors, opened and checked against the model as built from
    its config, before any adapter renames its tensors (None: the task has none)."""
    location = getattr(task, "pretrained_weights", "")
    if not location:
        return None
    from ..weights.pretrained import open_pretrained

    return open_pretrained(location, model)


def weights_source(model: nn.Module, config: TrainConfig, pretrained: Any = None) -> Source:
    """Where a meta-device model's values come from: the pretrained weights where they hold a
    tensor (under the plain model's names), the model's seeded initialization for the rest
    (LoRA adapters)."""
    init = SeededInit(model, config.seed)
    if pretrained is None:
        return init
    from ..hf.lora import base_name

    return Routed(pretrained, init, base_name)


class Routed:
    """Pretrained values under the plain model's names, the initialization elsewhere."""

    def __init__(self, pretrained: Any, init: Source, rename: Callable[[str], str]) -> None:
        self.pretrained, self.init, self.rename = pretrained, init, rename
        self.known = pretrained.names()

    def read(self, name: str, index: Index, dtype: torch.dtype) -> torch.Tensor:
        plain = self.rename(name)
        if plain in self.known:
            return self.pretrained.read(plain, index, dtype)  # type: ignore[no-any-return]
        return self.init.read(name, index, dtype)


def build_model(task: Task, config: TrainConfig, model: nn.Module | None = None) -> nn.Module:
    """The task's model (or `model`) as this config trains it, whole on the host.

    Seeded first, so a run, its evaluation and its export build the same initial weights
    (a LoRA checkpoint holds only the adapters: the rest comes from here). Then `adapt`.
    """
    ops.seed_host(config.seed)  # the model's initial weights depend on it
    model = model if model is not None else task.build_model()
    model = adapt(model, config)
    seed_adapters(model, config.seed)
    return model


def seed_adapters(model: nn.Module, seed: int) -> None:
    """Give a whole model's LoRA adapters the values a model built on the meta device gets
    (each adapter from its own seeded generator): a run's adapters start the same whether its
    base was loaded whole or read by shards."""
    from ..hf.lora import is_lora

    if not is_lora(model) or any(p.is_meta for p in model.parameters()):
        return  # no adapters, or no values yet (`plan` builds on the meta device)
    try:
        init = SeededInit(model, seed)
    except NotInitializable:
        return  # a module without its own initialization: peft's draws stay
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_" in name:
                param.copy_(init.read(name, whole(param.shape), param.dtype))


def adapt(model: nn.Module, config: TrainConfig) -> nn.Module:
    """Hugging Face models get what XLA needs (`hf.prepare`), then LoRA adapters if `[lora]`
    asks, then scanned blocks, then the precision's parameter dtype."""
    hf.prepare(model, moe_settings(config))
    if config.lora:
        from ..hf.lora import LoraSettings, apply_lora

        model = apply_lora(model, LoraSettings.from_dict(config.lora), config.precision)
    if config.scan_layers:  # checkpointing, if asked for, happens inside the scan
        if hf.is_hf_model(model):
            raise ConfigError(
                "scan_layers needs blocks that map hidden states to hidden states in a "
                "BlockStack; a Hugging Face decoder runs its own layer loop (masks, rotary "
                "embeddings): set scan_layers = false"
            )
        enable_scan(model, remat=config.activation_checkpointing)
    Precision.from_name(config.precision).convert_module(model)
    return model


def sharding_rules(
    task: Task, model: nn.Module, config: TrainConfig, strategy: Strategy
) -> list[Rule]:
    """How parameters are laid out over the mesh, first match wins: the config's
    `sharding_rules`, the task's `sharding_rules`, then a Hugging Face model's own
    tensor-parallel plan when the mesh has a `tensor` axis and expert-parallel plan when it
    has an `expert` axis."""
    written = parse_rules(config.sharding_rules, "sharding_rules")
    if written and not strategy.lays_out_parameters:
        raise RuntimeConfigError(
            "sharding_rules lay parameters out over a device mesh: use --strategy fsdp or spmd"
        )
    if not strategy.lays_out_parameters:
        return []
    return mesh_rules(task, model, config, strategy.mesh_axes())


def mesh_rules(
    task: Task, model: nn.Module, config: TrainConfig, mesh: Mapping[str, int]
) -> list[Rule]:
    """The rules on a mesh of these axis sizes (what `plan` asks of meshes it only imagines);
    the task's `check_mesh` and a Hugging Face model's head or expert count may refuse it."""
    written = parse_rules(config.sharding_rules, "sharding_rules")
    rules = written + parse_rules(getattr(task, "sharding_rules", ()), f"task {task.name!r}")
    check = getattr(task, "check_mesh", None)
    if callable(check):
        check(dict(mesh))
    tensor = mesh.get("tensor", 1)
    if tensor > 1 and hf.is_hf_model(model):
        from ..hf.tensor_parallel import tensor_parallel_rules

        rules += tensor_parallel_rules(model, tensor)
    expert = mesh.get("expert", 1)
    if expert > 1 and hf.is_hf_model(model):
        from ..hf.expert_parallel import expert_parallel_rules

        rules += expert_parallel_rules(model, expert)
    return rules


def moe_settings(config: TrainConfig) -> MoeSettings | None:
    """The `[moe]` table's settings (None: the defaults; transformers may be absent)."""
    if not config.moe:
        return None
    from ..hf.moe import MoeSettings

    return MoeSettings.from_dict(config.moe)


def unscanned(config: TrainConfig) -> TrainConfig:
    """The config with scan_layers off: checkpoints hold per-block names, so a scanned
    run's weights load into the unrolled model any strategy can run."""
    return dataclasses.replace(config, scan_layers=False)


def parameter_counts(model: nn.Module) -> dict[str, int]:
    """Trainable and total parameters (elements; a tied tensor counts once), and for a
    mixture of experts those one token uses (`active`: its top-k experts, not all)."""
    params = list(model.parameters())  # distinct tensors
    counts = {
        "trainable": sum(p.numel() for p in params if p.requires_grad),
        "total": sum(p.numel() for p in params),
    }
    if hf.is_hf_model(model):
        from ..hf.moe import active_parameters

        active = active_parameters(model)
        if active is not None:
            counts["active"] = active
    return counts


def describe_parameters(counts: dict[str, int]) -> str:
    """One line for the start-of-run report: trainable against total parameters (and the
    active ones of a mixture of experts)."""
    trainable, total = counts["trainable"], counts["total"]
    share = 100.0 * trainable / max(total, 1)
    line = f"parameters: {_count(trainable)} trainable of {_count(total)} ({share:.2f}%)"
    if "active" in counts:
        line += f", {_count(counts['active'])} active per token"
    return line


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)
