"""What `plan` sizes: the model a run would train, built on the meta device, with the batch
it would see, the loss it would run, its optimizer's state and its layout on any mesh.

The model comes from the project's task (a config file and `--set`, as `train` takes them)
or from a Hugging Face decoder alone: its config (`--hf-config`: a model in the local
cache, or a directory holding its `config.json`) or an architecture and a shape
(`--architecture llama --size 8b`). Either way it is built on PyTorch's meta device:
shapes and dtypes, no memory, nothing downloaded. `build_model` adds what a run adds: LoRA
adapters, the precision's parameter dtype. It also says what a run would read to materialize
the model (`host_memory.py`): a pretrained decoder's weights in their checkpoint's dtype, the
tensors a weight converter makes from several (a mixture's stacked experts), or nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from ..core import ops
from ..core.memory import SCALAR_STATE_COUNTED
from ..core.sharding import Spec, layout
from ..core.strategies.interface import blocks_of
from ..hf.common import unwrap
from ..tasks import Task, block_class, load_task
from ..training.config import TrainConfig
from ..training.model import (
    build_model,
    describe_parameters,
    mesh_rules,
    objective_of,
    parameter_counts,
    unscanned,
)
from ..training.optim import build_optimizer, counts_on_device
from ..weights.meta import parameters_on_meta

Batch = dict[str, torch.Tensor]
NEEDS_TRANSFORMERS = "{option} needs transformers: pip install -e '.[hf]'"
# The dtype of a pretrained decoder's weights when its config names none: bf16, as the
# published Llama 3 and Mixtral checkpoints are.
CHECKPOINT_DTYPE = torch.bfloat16
# Architectures an unknown one's error names as examples.
EXAMPLES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gpt2")


@dataclass(frozen=True)
class Parameter:
    """One distinct parameter tensor: every name it has (tied weights have several)."""

    names: tuple[str, ...]
    shape: tuple[int, ...]
    itemsize: int
    trainable: bool


@dataclass(frozen=True)
class StateTensor:
    """One tensor of optimizer state, and the parameter it belongs to."""

    parameter: int  # index into Workload.parameters
    shape: tuple[int, ...]
    itemsize: int


@dataclass
class HFConfigTask:
    """A Hugging Face config standing in for a task: its decoder, a next-token loss."""

    hf_config: Any
    seq_len: int
    name: str = "hf-config"

    def build_model(self) -> nn.Module:
        from ..hf.models import build_decoder

        return build_decoder(self.hf_config)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        from ..hf.moe import add_router_loss

        output = model(input_ids=batch["x"])
        loss = F.cross_entropy(output.logits.flatten(0, 1).float(), batch["y"].flatten())
        return add_router_loss(loss, model, output)


class Workload:
    """The model of a run on the meta device, and what the planner asks of it."""

    def __init__(self, task: Task, config: TrainConfig, sample: Mapping[str, torch.Tensor]):
        self.task, self.config = task, config
        # Every tensor the build makes: shapes only; a task of pretrained weights builds its
        # model from their config, as a run does (the weights are not read).
        with torch.device("meta"), parameters_on_meta():
            self.model = build_model(task, config)
        self.sample = {key: value.to("meta") for key, value in sample.items()}
        self.tensors: list[nn.Parameter] = []
        names: dict[int, list[str]] = {}
        for name, param in self.model.named_parameters(remove_duplicate=False):
            if id(param) not in names:
                self.tensors.append(param)
            names.setdefault(id(param), []).append(name)
        self.parameters = [
            Parameter(tuple(names[id(p)]), tuple(p.shape), p.element_size(), p.requires_grad)
            for p in self.tensors
        ]
        index = {id(p): i for i, p in enumerate(self.tensors)}
        self.blocks = blocks_of(self.model, block_class(task, self.model))
        self.block_parameters = [{index[id(p)] for p in b.parameters()} for b in self.blocks]
        self.in_blocks: set[int] = set().union(*self.block_parameters)
        self.hugging_face = unwrap(self.model) is not None
        # Bytes per element of the pretrained weights a run reads (None: it reads none, the
        # model is initialized where it lives, in its own dtype).
        self.checkpoint_itemsize = _checkpoint_itemsize(task)
        self.converted = _converted(self.model, index) if self.hugging_face else set()
        # DPO without LoRA holds a frozen copy of the model beside it; its forward, without
        # gradients, keeps nothing for the backward pass: the model itself stands in for it.
        wants_copy = getattr(task, "wants_copy", None)
        self.reference_copy = bool(wants_copy and wants_copy(_is_lora(self.model)))
        if self.reference_copy:
            task.reference = self.model  # type: ignore[attr-defined]

    def rules_layout(self, mesh: Mapping[str, int]) -> list[Spec]:
        """Every parameter's layout on `mesh`, by the rules a run would use (errors name the
        rule, parameter or head count that does not fit the mesh)."""
        rules = mesh_rules(self.task, self.model, self.config, mesh)
        names = {p.names[0]: p.names for p in self.parameters}
        shapes = {p.names[0]: p.shape for p in self.parameters}
        specs = layout(names, shapes, rules, mesh)
        return [specs[p.names[0]] for p in self.parameters]

    def batch(self, samples: int) -> Batch:
        """A batch of `samples` samples shaped like the task's, on the meta device."""
        return {
            key: torch.empty((samples, *value.shape), dtype=value.dtype, device="meta")
            for key, value in self.sample.items()
        }

    def loss(self, batch: Batch) -> torch.Tensor:
        return self.task.loss(self.model, batch)

    def optimizer_state(self) -> list[StateTensor]:
        """The state the run's optimizer keeps, created as the run creates it (one dry step),
        on the meta device."""
        optimizer = build_optimizer(self.model, self.config, self.task)
        ops.prime_optimizer_state(optimizer)
        index = {id(p): i for i, p in enumerate(self.tensors)}
        # The run counts device tensors only. On the meta device AdamW keeps its step counts
        # on the host; on XLA they are device scalars (capturable), as the run builds it.
        counters = counts_on_device(self.config, self.task) and SCALAR_STATE_COUNTED
        state = [
            StateTensor(index[id(param)], tuple(value.shape), value.element_size())
            for param, entries in optimizer.state.items()
            for key, value in entries.items()
            if torch.is_tensor(value)
            and (value.device.type == "meta" or (counters and key == "step"))
        ]
        for param in self.tensors:
            param.grad = None
        return state

    def counts(self) -> dict[str, int]:
        """Trainable and total parameters, as a run counts them (a tied tensor once)."""
        return parameter_counts(self.model)

    def describe(self) -> str:
        """`parameters: 8.03B trainable of 8.03B (100.00%)`, as a run reports it."""
        return describe_parameters(self.counts())


def _is_lora(model: nn.Module) -> bool:
    try:
        from ..hf.lora import is_lora
    except ImportError:  # a project without transformers trains no adapters
        return False
    return bool(is_lora(model))


def _checkpoint_itemsize(task: Task) -> int | None:
    """A pretrained decoder's (an `--hf-config` or `--architecture` plan, a task's `model_name`)
    weights' bytes per element: its config's `dtype`, else bf16's. None for a model a run
    initializes."""
    if not isinstance(task, HFConfigTask) and not getattr(task, "model_name", ""):
        return None
    config = getattr(task, "hf_config", None) or getattr(task, "config", None)
    dtype = getattr(config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        dtype = CHECKPOINT_DTYPE
    return dtype.itemsize


def _converted(model: nn.Module, index: Mapping[int, int]) -> set[int]:
    """Parameters a weight converter makes from several checkpoint tensors: a mixture's
    stacked experts (`[experts, out, in]`, stored per expert in the published checkpoints)."""
    from ..hf.moe import experts_modules

    return {
        index[id(param)]
        for module in experts_modules(model)
        for param in module.parameters(recurse=False)
        if id(param) in index
    }


def from_task(config: TrainConfig) -> Workload:
    """The project's task as `train` would build it (its data read for one sample's shape;
    an `hf:` dataset is not fetched: the example tasks' models do not depend on it)."""
    data = "" if config.data.startswith("hf:") else config.data
    task = objective_of(config, load_task(config.task, data, config.task_options))
    dataset: Any = task.train_dataset()
    sample = dataset[0] if hasattr(dataset, "__getitem__") else next(iter(dataset))
    return Workload(task, _plannable(config), sample)


def from_hf_config(name: str, config: TrainConfig, seq_len: int) -> Workload:
    """A decoder built from a Hugging Face config (the local cache, or a directory)."""
    try:
        from ..hf.models import pretrained_config

        hf_config = pretrained_config(name)
    except ImportError:
        raise ValueError(NEEDS_TRANSFORMERS.format(option="--hf-config")) from None
    return _decoder(hf_config, name, config, seq_len)


def from_architecture(architecture: str, size: str, config: TrainConfig, seq_len: int) -> Workload:
    """A decoder of a transformers architecture in the shape `size` gives (`architectures.py`)."""
    from .architectures import parse_size

    try:
        from ..hf.models import architectures, decoder_config

        known = architectures()
    except ImportError:
        raise ValueError(NEEDS_TRANSFORMERS.format(option="--architecture")) from None
    if architecture not in known:
        raise ValueError(
            f"unknown architecture {architecture!r}: transformers builds no decoder of that "
            f"model type (e.g. {', '.join(name for name in known if name in EXAMPLES)})"
        )
    hf_config = decoder_config(architecture, parse_size(architecture, size, seq_len))
    return _decoder(hf_config, f"{architecture} {size}", config, seq_len)


def _decoder(hf_config: Any, name: str, config: TrainConfig, seq_len: int) -> Workload:
    tokens = torch.zeros(seq_len, dtype=torch.long, device="meta")
    sample = {"x": tokens, "y": tokens}
    # Only its model and its loss are asked of a task here: the config stands in for one.
    task = cast(Task, HFConfigTask(hf_config, seq_len, name=name))
    return Workload(task, _plannable(config), sample)


def _plannable(config: TrainConfig) -> TrainConfig:
    # A scanned run holds the same parameters; its blocks run through torch_xla's scan,
    # which the meta device cannot: the unrolled model stands in for it.
    return dataclasses.replace(unscanned(config), activation_checkpointing=False)
