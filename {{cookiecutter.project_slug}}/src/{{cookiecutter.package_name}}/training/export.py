"""Export: a checkpoint's weights for use outside this project, on a CPU with torch alone.

Two formats. `safetensors`: one file whose metadata names the task and its options, so
`load_exported(path)` builds the same model on a CPU (no torch_xla) and loads the
weights, tied ones included. `hf`: a Hugging Face model directory that
`AutoModelForCausalLM.from_pretrained(DIR)` (and `AutoTokenizer`, when the model came with
a tokenizer) loads, sharded with an index above `max_shard_size` as `save_pretrained`
shards, or with `adapter_only` the LoRA adapter alone, for `peft`. A LoRA run's adapters are
merged into the base weights unless only the adapter is asked for. Either way no process
holds more than one tensor of the model at a time (`weights/export.py`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from ..hf.lora import is_lora
from ..tasks import load_task
from ..weights.export import export_adapter, export_hf, export_single_file
from .checkpoint import FORMAT, read_config
from .config import ConfigError, build_config
from .model import build, unscanned

EXPORT_FORMAT = f"{FORMAT}-export"
FORMATS = ("safetensors", "hf")


def export_checkpoint(
    location: str,
    out: str | Path,
    format: str = "safetensors",
    adapter_only: bool = False,
    max_shard_size: str = "5GB",
) -> dict[str, Any]:
    """Write the weights of a checkpoint (or the newest in a directory) to `out`, a tensor at
    a time: the model is built on the meta device, as the run built it, and never whole."""
    if format not in FORMATS:
        raise ConfigError(f"unknown export format {format!r}: use {' or '.join(FORMATS)}")
    if adapter_only and format != "hf":
        raise ConfigError("--adapter-only writes a peft adapter: use it with --format hf")
    path, saved = read_config(location)
    config = build_config(None, {k: v for k, v in saved.items() if k != "resume"})
    task = load_task(config.task, config.data, config.task_options)
    built = build(task, unscanned(config))  # a LoRA run's base comes from its source
    tokenizer = getattr(task, "tokenizer", None)
    if adapter_only:
        if not is_lora(built.model):
            raise ConfigError(f"{path!r} is not a LoRA run's checkpoint: it has no adapter alone")
        written = export_adapter(built.model, path, Path(out), tokenizer)
    elif format == "hf":
        written = export_hf(built.model, built.source, path, Path(out), max_shard_size, tokenizer)
    else:
        metadata = {
            "format": EXPORT_FORMAT,
            "task": config.task,
            "task_options": json.dumps(config.task_options),
            "checkpoint": path,
        }
        written = export_single_file(built.model, built.source, path, Path(out), metadata)
    return {"checkpoint": path, **written}


def load_exported(path: str | Path) -> nn.Module:
    """Rebuild the exported model on the CPU and load its weights (torch only)."""
    from safetensors import safe_open
    from safetensors.torch import load_model

    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    if metadata.get("format") != EXPORT_FORMAT:
        raise ValueError(f"{str(path)!r} is not a model exported by this project")
    task = load_task(metadata["task"], options=json.loads(metadata["task_options"]))
    model = task.build_model()
    load_model(model, str(path))
    return model.eval()
