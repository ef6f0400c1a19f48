"""The model generation and evaluation run: the task's model built and laid out as training
builds and lays it out (on the meta device, over the plan's mesh), given its weights from a
run's checkpoint (read as a resume reads it, resharded to this layout) or from the task
itself (pretrained safetensors read by shard, or the seeded initialization)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from ..core import Plan
from ..tasks import Task, block_class, load_task
from ..training.config import ConfigError, TrainConfig

# The config keys that make the model: a checkpoint holds weights of the model they build.
MODEL_KEYS = ("task", "task_options", "lora", "precision")


@dataclass
class Loaded:
    """A laid-out model in eval mode, its task and its tokenizer."""

    task: Task
    model: nn.Module
    tokenizer: Any


def check_same_model(config: TrainConfig, saved: dict[str, Any], checkpoint: str) -> None:
    """Refuse a checkpoint saved by a run of another model than `config` builds."""
    for key in MODEL_KEYS:
        if key in saved and saved[key] != getattr(config, key):
            raise ConfigError(
                f"the checkpoint {checkpoint!r} holds another model: its {key} is "
                f"{saved[key]!r}, the config's {getattr(config, key)!r} (give no --config, "
                "or the config the checkpoint's run trained)"
            )


def task_tokenizer(task: Task) -> Any:
    """The task's tokenizer, or, for a byte-level vocabulary, the byte tokenizer."""
    tokenizer = getattr(task, "tokenizer", None)
    if tokenizer is not None:
        return tokenizer
    from ..hf.byte_tokenizer import byte_tokenizer

    return byte_tokenizer()


def load_model(
    config: TrainConfig, plan: Plan, checkpoint: str | None = None, merge_lora: bool = False
) -> Loaded:
    """The config's model on the plan's layout, its weights from `checkpoint` (a run's, any
    layout) or from its task; LoRA adapters kept apart, or merged into the base."""
    from ..hf.lora import is_lora
    from ..training.checkpoint import load_weights
    from ..training.model import build, read_over, sharding_rules, unscanned

    task = load_task(config.task, config.data, config.task_options)
    built = build(task, unscanned(config))
    model = built.model
    rules = sharding_rules(task, model, config, plan.strategy)
    source = read_over(built) if checkpoint else built.source
    model, _ = plan.strategy.setup_model(
        model, block_class(task, model), rules=rules, source=source
    )
    if checkpoint:
        load_weights(checkpoint, plan.strategy, model)  # resharded to this layout
    if merge_lora and is_lora(model):
        model.merge_adapter()  # type: ignore[operator]
    model.eval()
    return Loaded(task, model, task_tokenizer(task))
