"""Tiny Hugging Face models and tokenizers for the tests: written here, nothing downloaded."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import default_collate

# A decoder small enough to compile and train in seconds on XLA:CPU.
TINY: dict[str, Any] = {"max_bytes": 20_000, "seq_len": 16, "dim": 32, "layers": 2, "heads": 4}
FINE_TUNE_LORA = {"rank": 4, "alpha": 8}


def first_batch(task: Any, size: int = 4) -> dict[str, torch.Tensor]:
    data = task.train_dataset()
    return dict(default_collate([data[i] for i in range(size)]))


def train_tokenizer(vocab_size: int = 320) -> Any:
    """A byte-level BPE tokenizer trained on the standard library's sources, with an eos."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    from {{ cookiecutter.package_name }}.tasks._corpus import stdlib_corpus

    bpe = ByteLevelBPETokenizer()
    text = stdlib_corpus(50_000).decode("utf-8", errors="replace")
    bpe.train_from_iterator(
        [text], vocab_size=vocab_size, min_frequency=2, show_progress=False,
        special_tokens=["<|endoftext|>"],
    )  # fmt: skip
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>")


def save_tiny_pretrained(folder: Path, tokenizer: bool = True, seed: int = 1) -> Path:
    """A tiny Llama (tied embeddings) written by save_pretrained, with its tokenizer or not."""
    from transformers import LlamaConfig, LlamaForCausalLM

    bpe = train_tokenizer()
    config = LlamaConfig(
        vocab_size=len(bpe), max_position_embeddings=64, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        tie_word_embeddings=True, eos_token_id=bpe.eos_token_id, bos_token_id=None,
        pad_token_id=None,
    )  # fmt: skip
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(folder)
    if tokenizer:
        bpe.save_pretrained(folder)
    return folder


def cache_tiny_pretrained(hf_home: Path, repo_id: str) -> dict[str, float]:
    """Write a tiny Llama and its tokenizer in the Hugging Face hub cache layout.

    The layout is the one `hf download` writes: blobs, a snapshot of symlinks, refs/main.
    """
    from transformers import AutoModelForCausalLM

    saved = save_tiny_pretrained(hf_home / "saved")
    model = AutoModelForCausalLM.from_pretrained(saved)
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for file in saved.iterdir():
        data = file.read_bytes()
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", blob))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    embed = model.get_input_embeddings().weight
    return {"embed_sum": embed.sum().item(), "vocab": model.config.vocab_size}


def assert_only_adapters_saved(saved: set[str]) -> None:
    """A LoRA checkpoint's names (`saved_keys`) hold the adapters and their AdamW moments,
    not the frozen base; the tables the names belong to are left out."""
    keys = {k for k in saved if not any(other.startswith(k + ".") for other in saved)}
    weights = {k for k in keys if k.startswith("model.")}
    moments = {k for k in keys if k.startswith("optimizer.state.")}
    assert weights and all(".lora_A." in k or ".lora_B." in k for k in weights), weights
    adapters = {k.removeprefix("model.") for k in weights}
    assert {k.removeprefix("optimizer.state.").rsplit(".", 1)[0] for k in moments} == adapters
    assert not any("embed_tokens" in k or "base_layer" in k for k in keys)


def pretrained_losses(
    base: str,
    devices: str,
    strategy: str,
    mesh: str,
    lora: bool,
    steps: int,
    ways: tuple[str, ...] = ("by shards", "whole"),
    **settings: Any,
) -> dict[str, dict[str, Any]]:
    """A fine-tuning of the pretrained model at `base`, twice: its model read by shards, then
    loaded whole by from_pretrained and handed to the trainer, as every run loaded it before.
    Each way's losses and trainable count, from its own launch (processes) of the run; `ways`
    picks the ways run."""
    from {{ cookiecutter.package_name }}.core import launch
    from {{ cookiecutter.package_name }}.training import build_config, plan_of

    from training_helpers import QUIET
    from training_helpers import TINY as TINY_RUN

    options = {"model_name": base, "seq_len": 16, "max_bytes": 40_000}
    config = build_config(None, {
        **TINY_RUN, **QUIET, "task": "hf-causal-lm", "task_options": options,
        "devices": devices, "strategy": strategy, "mesh": mesh, "max_steps": steps,
        "log_every": 1, "lr": 1e-2, "warmup_steps": 2, "eval_every": 0,
        **({"lora": FINE_TUNE_LORA} if lora else {}), **settings,
    })  # fmt: skip
    plan = plan_of(config)
    return {way: launch(_fine_tune, plan, (config, way == "whole")) for way in ways}


def _fine_tune(config: Any, whole: bool) -> dict[str, Any]:
    import tempfile

    from {{ cookiecutter.package_name }}.hf.models import load_decoder
    from {{ cookiecutter.package_name }}.training import fit, plan_of

    model = load_decoder(config.task_options["model_name"]) if whole else None
    with tempfile.TemporaryDirectory() as run_dir:
        config.run_dir = run_dir
        summary = fit(config, plan_of(config), model=model)
    return {"losses": [loss for _, loss in summary["train_losses"]],
            "trainable": summary["parameters"]["trainable"]}  # fmt: skip
