"""Export: a checkpoint's weights as one safetensors file, rebuilt and loaded with torch alone.

The file's metadata names the task and its options, so `load_exported(path)` builds
the same model on a CPU (no torch_xla, no training data read beyond what the task's
constructor reads) and loads the weights, tied ones included.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from ..core.checkpointing import read
from ..tasks import load_task
from .checkpoint import FORMAT, read_config
from .config import build_config

EXPORT_FORMAT = f"{FORMAT}-export"


def export_checkpoint(location: str, out: str | Path) -> dict[str, Any]:
    """Write the weights of a checkpoint (or the newest in a directory) to `out`."""
    from safetensors.torch import save_model

    path, saved = read_config(location)
    config = build_config(None, {k: v for k, v in saved.items() if k != "resume"})
    model = load_task(config.task, config.data, config.task_options).build_model()
    read(path, {"model": model.state_dict()})  # plain CPU tensors, whatever the saved layout
    metadata = {
        "format": EXPORT_FORMAT,
        "task": config.task,
        "task_options": json.dumps(config.task_options),
        "checkpoint": path,
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    save_model(model, str(out), metadata=metadata)  # writes tied weights once
    return {"checkpoint": path, "parameters": sum(p.numel() for p in model.parameters())}


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
