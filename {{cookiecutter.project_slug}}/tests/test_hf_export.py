"""`export --format hf`: a Hugging Face model directory that transformers loads in plain torch
on a CPU, from a checkpoint of any strategy (fsdp, one device on gs://), ties intact."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from backend_facts import MANY_DEVICES, many
from training_helpers import TINY, cli, write_config

pytestmark = pytest.mark.hf

STEPS = 6


def train(tmp_path: Path, *flags: str) -> Path:
    """A short run of the tiny Llama through the CLI; its checkpoint directory."""
    config = write_config(tmp_path, max_steps=STEPS, log_every=STEPS, precision="32-true")
    run_dir = tmp_path / "run"
    result = cli("train", "--config", str(config), "--run-dir", str(run_dir), *flags)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir / "checkpoints"


@pytest.fixture(scope="module")
def fsdp_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama trained under fsdp: its checkpoint directory."""
    folder = tmp_path_factory.mktemp("fsdp")
    return train(folder, *many("fsdp"), "--batch-size", str(8 // MANY_DEVICES))


def export(checkpoint: str, out: Path, *flags: str) -> Any:
    return cli("export", "--checkpoint", checkpoint, "--out", str(out), "--format", "hf", *flags)


def test_fsdp_checkpoint_exports_what_transformers_loads(
    fsdp_checkpoint: Path, tmp_path: Path, python_subprocess: Any
) -> None:
    """It exports the fsdp run; a CPU-only process loads it, same logits, and generates."""
    out = tmp_path / "hf"
    exported = export(str(fsdp_checkpoint), out)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}

    trained = python_subprocess([__file__, "checkpoint", str(fsdp_checkpoint)])
    loaded = python_subprocess([__file__, "transformers", str(out)], env={"PJRT_DEVICE": ""})

    import torch

    torch.testing.assert_close(
        torch.tensor(loaded["logits"]), torch.tensor(trained["logits"]), rtol=1e-4, atol=1e-4
    )
    assert loaded["torch_xla_loaded"] is False
    assert loaded["tied"] is True, "the exported model lost its tie"
    assert loaded["new_tokens"] == 8 and isinstance(loaded["text"], str)
    assert loaded["use_cache"] is True


def test_large_weights_are_sharded_with_an_index(fsdp_checkpoint: Path, tmp_path: Path) -> None:
    """It splits the weights into indexed shards above --max-shard-size."""
    out = tmp_path / "sharded"
    exported = export(str(fsdp_checkpoint), out, "--max-shard-size", "20KB")
    assert exported.returncode == 0, exported.stderr[-3000:]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1 and all((out / shard).is_file() for shard in shards)

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.lm_head.weight is model.get_input_embeddings().weight


def test_checkpoint_on_gcs_exports(gcs_bucket: str, tmp_path: Path) -> None:
    """It exports a checkpoint written to gs:// (the local GCS emulator)."""
    remote = f"{gcs_bucket}/runs/hf"
    train(tmp_path, "--strategy", "single", "--checkpoint-dir", remote)
    out = tmp_path / "from-gcs"
    exported = export(remote, out)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert f"exported {remote}/{STEPS} -> {out}" in exported.stdout
    assert (out / "config.json").is_file()


def test_export_refuses_to_overwrite_and_what_it_cannot_write(
    fsdp_checkpoint: Path, tmp_path: Path
) -> None:
    """It refuses a non-empty --out and --adapter-only without LoRA, one line each, exit 2."""
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    for flags, start in (
        ((taken,), f"error: --out '{taken}' exists and is not empty"),
        ((tmp_path / "new", "--adapter-only"), "error: "),
    ):
        out, *rest = flags
        result = export(str(fsdp_checkpoint), Path(out), *rest)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(start), lines
    assert "is not a LoRA run's checkpoint" in lines[0]
    assert (taken / "notes.txt").read_text() == "mine" and not (tmp_path / "new").exists()


def sample_input() -> Any:
    """A fixed batch of the tiny task's eval set."""
    import torch

    from {{ cookiecutter.package_name }}.tasks import load_task

    task = load_task("hf-causal-lm", options=TINY["task_options"])
    dataset = task.eval_dataset()
    return torch.stack([dataset[i]["x"] for i in range(4)])


def logits_of_checkpoint(location: str) -> dict[str, Any]:
    """The trained model's logits on the fixed batch, on one device (child process)."""
    import torch

    from {{ cookiecutter.package_name }}.core import launch
    from {{ cookiecutter.package_name }}.tasks import load_task
    from {{ cookiecutter.package_name }}.training import build_config, plan_of
    from {{ cookiecutter.package_name }}.training.checkpoint import load_weights, read_config

    _, saved = read_config(location)
    one_device = {"resume": "", "devices": "1", "strategy": "single", "mesh": ""}
    config = build_config(None, {**saved, **one_device})
    plan = plan_of(config)

    def run(config: Any, plan: Any) -> dict[str, Any]:
        model, _ = plan.strategy.setup_model(load_task(config.task, options=config.task_options)
                                             .build_model())  # fmt: skip
        load_weights(location, plan.strategy, model)
        device = next(model.parameters()).device
        with torch.no_grad():
            logits = model.eval()(input_ids=sample_input().to(device)).logits
        return {"logits": logits.cpu().tolist()}

    return dict(launch(run, plan, (config, plan)))


def load_with_transformers(folder: str) -> dict[str, Any]:
    """Load the export with transformers alone (torch_xla unimportable); logits, generation."""
    sys.modules["torch_xla"] = None  # type: ignore[assignment]
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        logits = model(input_ids=sample_input()).logits
        prompt = tokenizer("def main(", return_tensors="pt")
        generated = model.generate(**prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    new = generated[0, prompt["input_ids"].shape[1] :]
    loaded = sys.modules.get("torch_xla") is not None
    return {
        "logits": logits.tolist(), "torch_xla_loaded": loaded,
        "tied": model.lm_head.weight is model.get_input_embeddings().weight,
        "new_tokens": len(new), "text": tokenizer.decode(new),
        "use_cache": model.config.use_cache,
    }  # fmt: skip


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    mode, where = sys.argv[1], sys.argv[2]
    result = logits_of_checkpoint(where) if mode == "checkpoint" else load_with_transformers(where)
    print(json.dumps(result))
