"""The Hugging Face causal LM task: any decoder transformers builds, its ties intact, offline."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from {{ cookiecutter.package_name }}.core import find_shared_parameters, move_to_device
from {{ cookiecutter.package_name }}.hf import HFConfigError, block_class
from {{ cookiecutter.package_name }}.tasks.hf_causal_lm import make_task

from backend_facts import PLAIN_TO_UNTIES
from hf_helpers import TINY, cache_tiny_pretrained, first_batch, save_tiny_pretrained

pytestmark = pytest.mark.hf

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "mistral": "MistralForCausalLM",
    "gpt2": "GPT2LMHeadModel",
}


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_architecture_builds_that_transformers_model(architecture):
    """It builds the architecture's own transformers class, its decoder layer the block."""
    model = make_task(**TINY, architecture=architecture).build_model()
    assert type(model).__name__ == ARCHITECTURES[architecture]
    block = block_class(model)
    assert block is not None and block.__name__ in model._no_split_modules
    assert sum(isinstance(m, block) for m in model.modules()) == TINY["layers"]


def test_model_keeps_its_tie_across_the_move(device):
    """It ties the output head to the token embedding, on the host and on the device."""
    model = make_task(**TINY, architecture="gemma").build_model()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert find_shared_parameters(model) == [["model.embed_tokens.weight", "lm_head.weight"]]
    count = len(list(model.parameters()))
    untied = copy.deepcopy(model).to(device)
    # The reason move_to_device re-ties (torch_xla): a plain .to() that unties.
    assert len(list(untied.parameters())) == count + PLAIN_TO_UNTIES, "plain .to() changed"

    move_to_device(model, device)

    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert len(list(model.parameters())) == count


def test_tie_embeddings_option_unties_and_ties():
    """It follows tie_embeddings over the architecture's own default."""
    untied = make_task(**TINY, architecture="gemma", tie_embeddings=False).build_model()
    tied = make_task(**TINY, architecture="llama", tie_embeddings=True).build_model()
    assert find_shared_parameters(untied) == []
    assert find_shared_parameters(tied) == [["model.embed_tokens.weight", "lm_head.weight"]]


def test_forward_is_causal():
    """It leaves the logits of earlier positions unchanged when later tokens change."""
    task = make_task(**TINY)
    model = task.build_model().eval()
    tokens = first_batch(task)["x"]
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 256

    with torch.no_grad():
        before = task.logits(model, {"x": tokens})
        after = task.logits(model, {"x": changed})

    assert torch.equal(before[:, :10], after[:, :10])
    assert not torch.equal(before[:, 10:], after[:, 10:])


def test_loss_and_metrics_on_the_device(device):
    """It gives a scalar loss and one mean token loss per sample (weighted by its tokens that
    carry loss) whose mean is that loss."""
    task = make_task(**TINY)
    model = move_to_device(task.build_model(), device)
    batch = {k: v.to(device) for k, v in first_batch(task, size=4).items()}

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


BAD_OPTIONS = {
    "unknown architecture": (
        {"architecture": "llamma"},
        r"^unknown architecture 'llamma': transformers knows no such model type",
    ),
    "encoder": (
        {"architecture": "bert"},
        r"^architecture 'bert' is a 'bert' encoder \(masked LM\)",
    ),
    "encoder-decoder": (
        {"architecture": "t5"},
        r"^architecture 't5' is a 't5' encoder-decoder model",
    ),
    "multimodal config the sizes do not reach": (
        {"architecture": "llama4"},
        r"^architecture 'llama4' configures a model whose decoder \('llama4_text'\) the size",
    ),
    "field the config lacks": (
        {"architecture": "llama4_text", "config_fields": {"interleave_moe_layers": 2}},
        r"^config_fields: Llama4TextConfig has no field 'interleave_moe_layers'",
    ),
    "size options beside model_name": (
        {"model_name": "some/model", "dim": 64, "layers": 4},
        r"^task option\(s\) dim, layers, heads conflict with model_name",
    ),
    "unknown option": ({"widht": 3}, r"^task 'hf-causal-lm' has no option 'widht'"),
    "heads not dividing dim": ({"dim": 30, "heads": 4}, r"^dim 30 is not a multiple of heads 4"),
}


@pytest.mark.parametrize("options,message", BAD_OPTIONS.values(), ids=BAD_OPTIONS)
def test_bad_model_options_fail_in_one_line(options, message):
    """It refuses a model it cannot train with one line naming what is wrong."""
    with pytest.raises(HFConfigError, match=message) as error:
        make_task(**{**TINY, **options}).build_model()
    assert "\n" not in str(error.value)


def test_scan_layers_is_refused_for_a_transformers_decoder():
    """It refuses scan_layers for a decoder that runs its own layer loop, in one line."""
    from {{ cookiecutter.package_name }}.training import ConfigError, build_config
    from {{ cookiecutter.package_name }}.training.model import build_model

    config = build_config(None, {"scan_layers": True, "task_options": TINY})
    with pytest.raises(ConfigError, match=r"^scan_layers needs blocks .* set scan_layers = false"):
        build_model(make_task(**TINY), config)


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
    "embed_sum": model.get_input_embeddings().weight.sum().item(),
    "tied": model.lm_head.weight is model.get_input_embeddings().weight,
    "vocab": model.config.vocab_size,
    "max_token": int(data.tokens.max()),
    "loss": task.loss(model, batch).item(),
}))
"""
OFFLINE = {"HF_HUB_OFFLINE": "1"}


def test_missing_pretrained_model_fails_in_one_line(tmp_path, python_subprocess):
    """It names the model and the command to cache it when it is not in the local cache."""
    result = python_subprocess(
        ["-c", CATCH_ERROR, "meta-llama/Llama-3.2-1B"],
        env={"HF_HOME": str(tmp_path / "empty"), **OFFLINE},
    )
    message = result["error"]
    assert "\n" not in message
    assert message.startswith("model_name 'meta-llama/Llama-3.2-1B': its config is not in the")
    assert "hf download meta-llama/Llama-3.2-1B" in message


def test_cached_model_without_its_tokenizer_fails_in_one_line(tmp_path, python_subprocess):
    """It refuses a cached model whose tokenizer is missing, naming the tokenizer."""
    saved = save_tiny_pretrained(tmp_path / "saved", tokenizer=False)
    result = python_subprocess(["-c", CATCH_ERROR, str(saved)], env=OFFLINE)
    assert "\n" not in result["error"]
    assert result["error"].startswith(f"model_name '{saved}': its tokenizer is not in the local")


def test_cached_encoder_is_refused_in_one_line(tmp_path, python_subprocess):
    """It refuses a saved encoder-only model by its kind."""
    from transformers import BertConfig

    BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2).save_pretrained(
        tmp_path / "bert"
    )
    result = python_subprocess(["-c", CATCH_ERROR, str(tmp_path / "bert")], env=OFFLINE)
    assert result["error"].startswith(f"model_name '{tmp_path / 'bert'}' is a 'bert' encoder")


def test_cached_pretrained_model_loads_with_its_tokenizer(tmp_path, python_subprocess):
    """It loads a Llama and its tokenizer from the Hugging Face cache, offline, weights intact."""
    expected = cache_tiny_pretrained(tmp_path / "hf", "local/tiny-llama")

    result = python_subprocess(
        ["-c", LOAD_PRETRAINED, "local/tiny-llama"],
        env={"HF_HOME": str(tmp_path / "hf"), **OFFLINE},
    )

    assert result["model"] == "LlamaForCausalLM"
    assert result["embed_sum"] == pytest.approx(expected["embed_sum"], rel=1e-6)
    assert result["tied"] and result["vocab"] == expected["vocab"]
    assert result["max_token"] >= 256, "the corpus was not tokenized with the model's tokenizer"
    assert math.isfinite(result["loss"])


def test_pretrained_cache_layout_is_the_hubs(tmp_path: Path):
    """It builds a cache that huggingface_hub itself reads as one model at revision main."""
    from huggingface_hub import scan_cache_dir

    cache_tiny_pretrained(tmp_path / "hf", "local/tiny-llama")
    info = scan_cache_dir(tmp_path / "hf" / "hub")

    assert not info.warnings
    (repo,) = info.repos
    assert repo.repo_id == "local/tiny-llama" and repo.repo_type == "model"
    assert [set(revision.refs) for revision in repo.revisions] == [{"main"}]
