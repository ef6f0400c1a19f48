"""Export: a checkpoint's weights for use outside this project, on a CPU with torch alone.

Two formats. `safetensors`: one file whose metadata names the task and its options, so
`load_exported(path)` builds the same model on a CPU (no torch_xla) and loads the
weights, tied ones included. `hf`: a Hugging Face model directory that
`AutoModelForCausalLM.from_pretrained(DIR)` (and `AutoTokenizer`, when the model came with
a tokenizer) loads, or with `adapter_only` the LoRA adapter alone, for `peft`. A LoRA
run's adapters are merged into the base weights unless only the adapter is asked for.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from torch import nn

from ..core.checkpointing import read
from ..hf.lora import is_lora, merged
from ..tasks import load_task
from .checkpoint import FORMAT, read_config, saved_weights
from .config import ConfigError, build_config
from .model import build_model, unscanned

EXPORT_FORMAT = f"{FORMAT}-export"
FORMATS = ("safetensors", "hf")


def export_checkpoint(
    location: str,
    out: str | Path,
    format: str = "safetensors",
    adapter_only: bool = False,
    max_shard_size: str = "5GB",
) -> dict[str, Any]:
    """Write the weights of a checkpoint (or the newest in a directory) to `out`."""
    if format not in FORMATS:
        raise ConfigError(f"unknown export format {format!r}: use {' or '.join(FORMATS)}")
    if adapter_only and format != "hf":
        raise ConfigError("--adapter-only writes a peft adapter: use it with --format hf")
    path, saved = read_config(location)
    config = build_config(None, {k: v for k, v in saved.items() if k != "resume"})
    task = load_task(config.task, config.data, config.task_options)
    model = build_model(task, unscanned(config))  # the base of a LoRA run comes from here
    read(path, {"model": saved_weights(None, model)})  # CPU tensors, whatever the layout
    if adapter_only and not is_lora(model):
        raise ConfigError(f"{path!r} is not a LoRA run's checkpoint: it has no adapter alone")
    if is_lora(model) and not adapter_only:
        model = merged(model)
    parameters = sum(p.numel() for p in model.parameters())
    if format == "hf":
        from ..hf.export import save_hf

        save_hf(model, getattr(task, "tokenizer", None), Path(out), max_shard_size)
    else:
        _save_safetensors(model, config, path, Path(out))
    return {"checkpoint": path, "parameters": parameters}


def _save_safetensors(model: nn.Module, config: Any, checkpoint: str, out: Path) -> None:
    from safetensors.torch import save_model

    metadata = {
        "format": EXPORT_FORMAT,
        "task": config.task,
        "task_options": json.dumps(config.task_options),
        "checkpoint": checkpoint,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as scratch:
        partial = Path(scratch) / out.name
        save_model(model, str(partial), metadata=metadata)  # writes tied weights once
        partial.replace(out)  # whole or not at all


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
