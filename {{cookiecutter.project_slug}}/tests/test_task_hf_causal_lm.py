"""The Hugging Face causal LM task: GPT-2 with its tie intact, scannable, and offline by design."""

from __future__ import annotations

import copy
import hashlib
import json
import math
from pathlib import Path

import pytest
import torch
from torch.utils.data import default_collate

from {{ cookiecutter.package_name }}.core import find_shared_parameters, move_to_device
from {{ cookiecutter.package_name }}.core.layers import enable_scan, stacked_parameters
from {{ cookiecutter.package_name }}.tasks.hf_causal_lm import make_task

TINY = {"max_bytes": 20_000, "seq_len": 16, "dim": 32, "layers": 2, "heads": 4}


def first_batch(task, size: int = 4) -> dict[str, torch.Tensor]:
    data = task.train_dataset()
    return default_collate([data[i] for i in range(size)])


def test_model_keeps_its_tie_across_the_move(xla_device):
    """It ties GPT-2's output head to its token embedding, on the host and on the device."""
    model = make_task(**TINY).build_model()
    assert model.lm_head.weight is model.transformer.wte.weight
    assert find_shared_parameters(model) == [["transformer.wte.weight", "lm_head.weight"]]
    count = len(list(model.parameters()))
    untied = copy.deepcopy(model).to(xla_device)
    assert len(list(untied.parameters())) == count + 1, "plain .to() keeps the tie now"

    move_to_device(model, xla_device)

    assert model.lm_head.weight is model.transformer.wte.weight
    assert len(list(model.parameters())) == count
    assert all(p.device.type == "xla" for p in model.parameters())


def test_forward_equals_hugging_face_gpt2():
    """It computes GPT2LMHeadModel's logits, and its state dict loads into one unchanged."""
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    model = make_task(**TINY).build_model().eval()
    reference = GPT2LMHeadModel(model.config).eval()
    reference.load_state_dict(model.state_dict(), strict=True)
    tokens = first_batch(make_task(**TINY))["x"]

    with torch.no_grad():
        assert torch.allclose(model(tokens), reference(tokens).logits, atol=1e-6)


def test_forward_is_causal():
    """It leaves the logits of earlier positions unchanged when later tokens change."""
    model = make_task(**TINY).build_model().eval()
    tokens = first_batch(make_task(**TINY))["x"]
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 256

    with torch.no_grad():
        before, after = model(tokens), model(changed)

    assert torch.equal(before[:, :10], after[:, :10])
    assert not torch.equal(before[:, 10:], after[:, 10:])


def test_loss_and_metrics_on_the_device(xla_device):
    """It gives a scalar loss and one mean token loss per sample (weighted by its tokens that
    carry loss) whose mean is that loss."""
    task = make_task(**TINY)
    model = move_to_device(task.build_model(), xla_device)
    batch = {k: v.to(xla_device) for k, v in first_batch(task, size=4).items()}

    loss = task.loss(model, batch)
    metrics = task.metrics(model, batch)

    assert batch["x"].shape == (4, task.tokens_per_sample)
    assert loss.shape == ()
    assert set(metrics) == {"loss", "weight"} and metrics["loss"].shape == (4,)
    assert metrics["weight"].tolist() == [task.tokens_per_sample] * 4  # no mask: every token
    assert metrics["loss"].mean().item() == pytest.approx(loss.item(), rel=1e-5)
    assert 0 < loss.item() < 2 * math.log(256)


def test_summarize_adds_perplexity_and_baseline():
    """It reports the perplexity of the mean loss and the context-free baseline."""
    task = make_task(**TINY)
    summary = task.summarize({"loss": 1.0})
    assert summary["loss"] == 1.0
    assert summary["perplexity"] == pytest.approx(math.e)
    assert 0 < summary["baseline"] < math.log(256)


def test_scanned_blocks_give_the_unrolled_loss_and_gradients(xla_device):
    """It gives the same loss and gradients with its blocks scanned as unrolled."""
    import torch_xla

    task = make_task(**TINY)
    batch = {k: v.to(xla_device) for k, v in first_batch(task).items()}
    results = []
    for scan in (False, True):
        torch.manual_seed(0)
        model = task.build_model()
        if scan:
            assert enable_scan(model) == TINY["layers"]
        move_to_device(model, xla_device)
        loss = task.loss(model, batch)
        graph = torch_xla._XLAC._get_xla_tensors_hlo([loss])
        assert ("while" in graph) == scan, "scan_layers' loop missing from (or in) the graph"
        loss.backward()
        torch_xla.sync()
        stacked = stacked_parameters(model)  # a scanned parameter: each block's own gradient
        grads = {
            plain: (p.grad if index is None else p.grad[index]).cpu()
            for name, p in model.named_parameters()
            for index, plain in stacked.get(p, [(None, name)])
        }
        results.append((loss.item(), grads))

    (unrolled, unrolled_grads), (scanned, scanned_grads) = results
    assert scanned_grads.keys() == unrolled_grads.keys()
    assert scanned == pytest.approx(unrolled, rel=1e-6)
    for name, grad in unrolled_grads.items():
        assert torch.allclose(scanned_grads[name], grad, rtol=1e-4, atol=1e-6), name


def test_architecture_options_conflict_with_model_name():
    """It refuses size options next to model_name, in one line, before loading anything."""
    with pytest.raises(ValueError, match=r"^task option\(s\) dim, layers conflict with model_name"):
        make_task(model_name="gpt2", dim=64, layers=4)


def test_other_architectures_are_refused_in_one_line(tmp_path):
    """It names the architecture it cannot train when model_name is not a GPT-2 model."""
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4).save_pretrained(
        tmp_path / "llama"
    )
    with pytest.raises(ValueError, match=r"is a 'llama' model; this task trains GPT-2") as error:
        make_task(model_name=str(tmp_path / "llama"), max_bytes=20_000)
    assert "\n" not in str(error.value)


CATCH_ERROR = """
import json, sys
from {{ cookiecutter.package_name }}.tasks.hf_causal_lm import make_task
try:
    make_task(model_name=sys.argv[1], max_bytes=20000)
    print(json.dumps({"error": None}))
except ValueError as error:
    print(json.dumps({"error": str(error)}))
"""

LOAD_PRETRAINED = """
import json, sys
from torch.utils.data import default_collate
from {{ cookiecutter.package_name }}.tasks.hf_causal_lm import make_task
task = make_task(model_name=sys.argv[1], max_bytes=20000, seq_len=16)
model = task.build_model()
data = task.train_dataset()
batch = default_collate([data[i] for i in range(2)])
print(json.dumps({
    "model": type(model).__name__,
    "wte_sum": model.transformer.wte.weight.sum().item(),
    "tied": model.lm_head.weight is model.transformer.wte.weight,
    "vocab": model.config.vocab_size,
    "max_token": int(data.tokens.max()),
    "loss": task.loss(model, batch).item(),
}))
"""


def cache_tiny_pretrained(hf_home: Path, repo_id: str) -> dict[str, float]:
    """Write a tiny GPT-2 and a byte-level BPE tokenizer in the Hugging Face hub cache layout.

    The layout is the one `hf download` writes: blobs, a snapshot of symlinks, refs/main.
    """
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    from {{ cookiecutter.package_name }}.tasks._corpus import stdlib_corpus

    bpe = ByteLevelBPETokenizer()
    text = stdlib_corpus(50_000).decode("utf-8", errors="replace")
    bpe.train_from_iterator([text], vocab_size=320, min_frequency=2, show_progress=False)
    tokenizer = GPT2TokenizerFast(tokenizer_object=bpe._tokenizer)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=32, n_embd=32, n_layer=2, n_head=4)
    torch.manual_seed(1)
    model = GPT2LMHeadModel(config)

    saved = hf_home / "saved"
    model.save_pretrained(saved)
    tokenizer.save_pretrained(saved)
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
    return {"wte_sum": model.transformer.wte.weight.sum().item(), "vocab": len(tokenizer)}


def test_missing_pretrained_model_fails_in_one_line(tmp_path, python_subprocess):
    """It names the model and the command to cache it when it is not in the local cache."""
    result = python_subprocess(
        ["-c", CATCH_ERROR, "openai-community/gpt2"],
        env={"HF_HOME": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1"},
    )
    message = result["error"]
    assert "\n" not in message
    assert message.startswith("model_name 'openai-community/gpt2': its config is not in the local")
    assert "hf download openai-community/gpt2" in message


def test_cached_pretrained_model_loads_with_its_tokenizer(tmp_path, python_subprocess):
    """It loads a model and its tokenizer from the Hugging Face cache, offline, weights intact."""
    expected = cache_tiny_pretrained(tmp_path / "hf", "local/tiny-gpt2")

    result = python_subprocess(
        ["-c", LOAD_PRETRAINED, "local/tiny-gpt2"],
        env={"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"},
    )

    assert result["model"] == "GPT2CausalLM"
    assert result["wte_sum"] == pytest.approx(expected["wte_sum"], rel=1e-6)
    assert result["tied"] and result["vocab"] == expected["vocab"]
    assert result["max_token"] >= 256, "the corpus was not tokenized with the model's tokenizer"
    assert math.isfinite(result["loss"])


def test_pretrained_cache_layout_is_the_hubs(tmp_path):
    """It builds a cache that huggingface_hub itself reads as one model at revision main."""
    from huggingface_hub import scan_cache_dir

    cache_tiny_pretrained(tmp_path / "hf", "local/tiny-gpt2")
    info = scan_cache_dir(tmp_path / "hf" / "hub")

    assert not info.warnings
    (repo,) = info.repos
    assert repo.repo_id == "local/tiny-gpt2" and repo.repo_type == "model"
    assert [set(revision.refs) for revision in repo.revisions] == [{"main"}]
    saved_config = json.loads((tmp_path / "hf" / "saved" / "config.json").read_text())
    assert saved_config["model_type"] == "gpt2"
