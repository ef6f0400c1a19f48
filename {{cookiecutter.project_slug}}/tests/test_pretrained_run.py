"""Fine-tuning a pretrained model read by shards: each device's slices read from the saved
safetensors into a model built on the meta device train exactly as the model loaded whole by
transformers' from_pretrained did, on one device and on meshes, with and without LoRA."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from hf_helpers import pretrained_losses, save_tiny_pretrained

pytestmark = [pytest.mark.hf, pytest.mark.slow]

STEPS = 20
{% if cookiecutter.backend == "torch_tpu" -%}
LAYOUTS = {"one device": ("1", "single", ""), "fsdp x4": ("4", "fsdp", ""),
           "fsdp x tensor 2x2": ("4", "fsdp", "fsdp=2,tensor=2")}  # fmt: skip
{%- else -%}
LAYOUTS = {"one device": ("1", "single", ""), "fsdp x8": ("8", "fsdp", ""),
           "fsdp x tensor 4x2": ("8", "fsdp", "fsdp=4,tensor=2")}  # fmt: skip
{%- endif %}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama saved in bf16 in several safetensors files (the usual Hub layout)."""
    from transformers import AutoModelForCausalLM

    folder = save_tiny_pretrained(tmp_path_factory.mktemp("fp32"))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    out = tmp_path_factory.mktemp("bf16")
    model.save_pretrained(out, max_shard_size="40KB")
    for extra in folder.iterdir():
        if "token" in extra.name:
            (out / extra.name).write_bytes(extra.read_bytes())
    assert (out / "model.safetensors.index.json").exists()
    return out


# Every layout in full; LoRA (its base frozen in the base's dtype) on the widest.
CASES = [(layout, "") for layout in LAYOUTS] + [(list(LAYOUTS)[-1], "1")]


IDS = [f"{layout} {'lora' if lora else 'full'}" for layout, lora in CASES]


@pytest.mark.parametrize(("layout", "lora"), CASES, ids=IDS)
def test_read_by_shards_trains_as_loaded_whole(
    base: Path, layout: str, lora: str, python_subprocess: Any
) -> None:
    """It reads each device's slices of the saved bf16 checkpoint (dtype converted per slice)
    and fine-tunes 20 steps to the losses of the model from_pretrained loaded whole."""
    # Two fine-tunings in one child (imports and compiles once): twice a child's usual time.
    runs = python_subprocess([__file__, str(base), *LAYOUTS[layout], lora], env={}, timeout=900)
    by_shards, whole = runs["by shards"], runs["whole"]
    assert by_shards["trainable"] == whole["trainable"]
    assert len(by_shards["losses"]) == STEPS
    assert by_shards["losses"] == pytest.approx(whole["losses"], rel=1e-5, abs=1e-6)


if __name__ == "__main__":
    base, devices, strategy, mesh, lora = sys.argv[1:6]
    print(json.dumps(pretrained_losses(base, devices, strategy, mesh, lora == "1", STEPS)))
