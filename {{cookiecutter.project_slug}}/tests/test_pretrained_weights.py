"""Pretrained Hugging Face weights read by slice: every tensor of a tiny Llama (tied and untied)
and of tiny mixtures of experts, saved in shards by save_pretrained, equal to what
from_pretrained loads, from a folder, the Hugging Face cache or gs://; a checkpoint of another
architecture or size refused in one line."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from {{ cookiecutter.package_name }}.weights.pretrained import (
    PretrainedWeights,
    open_pretrained,
    pretrained_config,
    pretrained_tokenizer,
)
from {{ cookiecutter.package_name }}.weights.storage import WeightsError

from hf_helpers import cache_tiny_pretrained, save_tiny_pretrained

pytestmark = pytest.mark.hf

INDEX = "model.safetensors.index.json"
SHARD = "20KB"  # each tiny model below in several files
MODELS = ("llama-tied", "llama", "mixtral", "qwen2_moe")
ALL = slice(None)


def tiny_config(kind: str, **changes: Any) -> Any:
    """A tiny decoder's config: Llama tied or not, Mixtral, Qwen2-MoE (its shared expert too)."""
    from transformers import LlamaConfig, MixtralConfig, Qwen2MoeConfig

    sizes = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
             **changes}  # fmt: skip
    if kind.startswith("llama"):
        return LlamaConfig(**sizes, tie_word_embeddings=kind == "llama-tied")
    if kind == "mixtral":
        return MixtralConfig(**sizes, num_local_experts=4, num_experts_per_tok=2)
    return Qwen2MoeConfig(**sizes, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                          shared_expert_intermediate_size=48)  # fmt: skip


def save(config: Any, folder: Path, seed: int = 0) -> Path:
    """A freshly initialised model in bf16, written in shards by save_pretrained."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(
        folder, max_shard_size=SHARD
    )
    return folder


def meta_model(config: Any) -> Any:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def weight_map(folder: Path) -> dict[str, str]:
    return dict(json.loads((folder / INDEX).read_text())["weight_map"])


def upload(folder: Path, url: str) -> str:
    import fsspec

    fs = fsspec.filesystem("gs")
    for file in folder.iterdir():
        fs.put_file(str(file), f"{url}/{file.name}")
    return url


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each tiny model saved once for the module."""
    root = tmp_path_factory.mktemp("pretrained")
    return {kind: save(tiny_config(kind), root / kind) for kind in MODELS}


@pytest.fixture(scope="module")
def loaded(saved: dict[str, Path]) -> dict[str, dict[str, torch.Tensor]]:
    """What from_pretrained loads from each, by the model's names."""
    from transformers import AutoModelForCausalLM

    return {kind: AutoModelForCausalLM.from_pretrained(folder).state_dict()
            for kind, folder in saved.items()}  # fmt: skip


def opened(folder: Path | str) -> PretrainedWeights:
    from transformers import AutoConfig

    return open_pretrained(str(folder), meta_model(AutoConfig.from_pretrained(folder)))


def assert_reads_as_loaded(weights: PretrainedWeights, expected: dict[str, torch.Tensor]) -> None:
    """Every tensor read whole, and sliced along dims 0 and 1, equals the loaded one."""
    assert weights.names() == set(expected)
    for name, tensor in expected.items():
        got = weights.read(name, tuple(ALL for _ in tensor.shape), tensor.dtype)
        assert got.dtype == tensor.dtype and torch.equal(got, tensor), name
        rest = tuple(ALL for _ in tensor.shape[1:])
        n = tensor.shape[0]
        got = weights.read(name, (slice(n // 4, n // 2 + 1), *rest), tensor.dtype)
        assert torch.equal(got, tensor[n // 4 : n // 2 + 1]), name
        if tensor.dim() >= 2:
            m = tensor.shape[1]
            got = weights.read(name, (ALL, slice(1, m - 1), *rest[1:]), tensor.dtype)
            assert torch.equal(got, tensor[:, 1 : m - 1]), name


def quarter_bound(weights: PretrainedWeights, expected: dict[str, torch.Tensor]) -> int:
    """Read the first quarter of dim 0 of every tensor; the bytes a quarter of each holds in
    bf16, a row rounded up."""
    bound = 0
    for name, tensor in expected.items():
        rows = math.ceil(tensor.shape[0] / 4)
        weights.read(name, (slice(0, rows), *(ALL for _ in tensor.shape[1:])), tensor.dtype)
        bound += rows * math.prod(tensor.shape[1:]) * 2
    return bound


@pytest.mark.parametrize("kind", MODELS)
def test_every_tensor_reads_as_from_pretrained_loads_it(
    kind: str, saved: dict[str, Path], loaded: dict[str, dict[str, torch.Tensor]]
) -> None:
    """It gives every tensor of the model, whole and sliced along dims 0 and 1, as loaded."""
    assert len(set(weight_map(saved[kind]).values())) > 1, "the checkpoint is not sharded"
    assert_reads_as_loaded(opened(saved[kind]), loaded[kind])


@pytest.mark.parametrize("kind", MODELS)
def test_dim0_quarter_fetches_a_quarter_of_the_bytes(
    kind: str, saved: dict[str, Path], loaded: dict[str, dict[str, torch.Tensor]]
) -> None:
    """It fetches at most a quarter of each tensor's bytes for the first quarter of dim 0."""
    weights = opened(saved[kind])
    bound = quarter_bound(weights, loaded[kind])
    assert 0 < weights.bytes_read <= bound


def test_tied_head_is_served_from_the_embedding(
    saved: dict[str, Path], loaded: dict[str, dict[str, torch.Tensor]]
) -> None:
    """It gives a tied model's head, which save_pretrained leaves out, the embedding's values."""
    weights = opened(saved["llama-tied"])
    head = weights.read("lm_head.weight", (slice(3, 9), ALL), torch.bfloat16)

    assert "lm_head.weight" not in weight_map(saved["llama-tied"])
    assert torch.equal(head, loaded["llama-tied"]["model.embed_tokens.weight"][3:9])
    untied = loaded["llama"]
    assert not torch.equal(untied["lm_head.weight"], untied["model.embed_tokens.weight"])


def test_base_model_checkpoint_loads_under_the_heads_prefix(tmp_path: Path) -> None:
    """It reads a base model's checkpoint (GPT-2's keys, without `transformer.`) into the model
    with a head, its tied head from the embedding, as from_pretrained does."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2Model

    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                        bos_token_id=None, eos_token_id=None)  # fmt: skip
    torch.manual_seed(0)
    GPT2Model(config).save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as saved:
        keys = list(saved.keys())
    assert "h.0.attn.c_attn.weight" in keys

    weights = opened(tmp_path)

    expected = AutoModelForCausalLM.from_pretrained(tmp_path).state_dict()
    assert "transformer.h.0.attn.c_attn.weight" in expected
    assert weights.names() == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(weights.read(name, (ALL,) * tensor.dim(), tensor.dtype), tensor), name


@pytest.mark.parametrize(
    ("kind", "stored", "stacked"),
    [("mixtral", "model.layers.1.block_sparse_moe.experts.3.w3.weight",
      "model.layers.1.mlp.experts.gate_up_proj"),
     ("qwen2_moe", "model.layers.1.mlp.experts.3.up_proj.weight",
      "model.layers.1.mlp.experts.gate_up_proj")],
)  # fmt: skip
def test_experts_saved_one_by_one_read_as_the_models_stack(
    kind: str, stored: str, stacked: str, saved: dict[str, Path]
) -> None:
    """It reads the experts save_pretrained writes one tensor each as the model's stacked tensor."""
    weights = opened(saved[kind])
    keys = weight_map(saved[kind])
    assert stored in keys and stacked not in keys
    assert stacked in weights.names()


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_expert_slice_reads_only_its_experts(
    kind: str, saved: dict[str, Path], loaded: dict[str, dict[str, torch.Tensor]]
) -> None:
    """It reads the experts of a dim-0 slice of a stacked tensor, not the others."""
    weights = opened(saved[kind])
    name = "model.layers.0.mlp.experts.gate_up_proj"
    expected = loaded[kind][name][1:3]

    got = weights.read(name, (slice(1, 3), ALL, ALL), torch.bfloat16)

    assert torch.equal(got, expected)
    assert weights.bytes_read == expected.numel() * 2  # experts 1 and 2, gate and up


def test_experts_saved_stacked_read_by_slice(
    tmp_path: Path, loaded: dict[str, dict[str, torch.Tensor]]
) -> None:
    """It reads a checkpoint in the model's own names (experts stacked) slice by slice."""
    from safetensors.torch import save_file

    values = loaded["mixtral"]
    tiny_config("mixtral").save_pretrained(tmp_path)
    save_file({k: v.contiguous() for k, v in values.items()}, tmp_path / "model.safetensors")
    weights = opened(tmp_path)

    name = "model.layers.1.mlp.experts.down_proj"
    got = weights.read(name, (slice(2, 4), ALL, ALL), torch.bfloat16)

    assert torch.equal(got, values[name][2:4])
    assert weights.bytes_read == got.numel() * 2
    assert_reads_as_loaded(weights, values)


@pytest.mark.parametrize("kind", ["llama-tied", "mixtral"])
def test_gs_copy_reads_as_the_local_folder(
    kind: str, saved: dict[str, Path], loaded: dict[str, dict[str, torch.Tensor]],
    gcs_bucket: str,
) -> None:  # fmt: skip
    """It reads a gs:// copy by byte range: every tensor as loaded, a quarter fetching a quarter."""
    url = upload(saved[kind], f"{gcs_bucket}/{kind}")
    config = tiny_config(kind)
    assert_reads_as_loaded(open_pretrained(url, meta_model(config)), loaded[kind])
    weights = open_pretrained(url, meta_model(config))
    bound = quarter_bound(weights, loaded[kind])
    assert 0 < weights.bytes_read <= bound


def test_cache_name_reads_its_snapshot_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It finds a model by its name in the local Hugging Face cache, nothing downloaded."""
    from huggingface_hub import constants
    from transformers import AutoConfig, AutoModelForCausalLM

    cache_tiny_pretrained(tmp_path / "hf", "local/tiny-llama")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    saved = tmp_path / "hf" / "saved"

    weights = open_pretrained("local/tiny-llama", meta_model(AutoConfig.from_pretrained(saved)))

    expected = AutoModelForCausalLM.from_pretrained(saved).state_dict()
    assert weights.names() == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(weights.read(name, (ALL,) * tensor.dim(), tensor.dtype), tensor), name


def test_name_not_in_the_cache_is_refused_with_the_download_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It refuses a name the local cache does not hold, saying how to fetch it."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(WeightsError) as error:
        open_pretrained("nobody/nothing", meta_model(tiny_config("llama")))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("model_name 'nobody/nothing': its weights is not in the local")
    assert "hf download nobody/nothing" in message


def test_gs_config_and_tokenizer_are_the_saved_ones(tmp_path: Path, gcs_bucket: str) -> None:
    """It reads a gs:// folder's config and tokenizer as a local folder's, named by the URL."""
    from transformers import AutoConfig, AutoTokenizer

    local = save_tiny_pretrained(tmp_path / "saved")
    url = upload(local, f"{gcs_bucket}/with-tokenizer")

    config, tokenizer = pretrained_config(url), pretrained_tokenizer(url)

    assert config.name_or_path == url
    expected = AutoConfig.from_pretrained(local).to_dict()
    assert config.to_dict() == {**expected, "_name_or_path": url}
    text = "def read(self, name):\n    return name  # a line of Python"
    assert tokenizer(text)["input_ids"] == AutoTokenizer.from_pretrained(local)(text)["input_ids"]
    assert tokenizer.name_or_path == url


def test_gs_folder_that_does_not_exist_has_no_config(gcs_bucket: str) -> None:
    """It refuses the config of a gs:// folder that is not there, in one line."""
    with pytest.raises(WeightsError) as error:
        pretrained_config(f"{gcs_bucket}/nowhere")
    assert str(error.value) == f"{gcs_bucket}/nowhere does not exist"


def test_checkpoint_of_fewer_layers_is_refused_naming_the_first_missing_tensor(
    saved: dict[str, Path],
) -> None:
    """It refuses a checkpoint without values for some of the model's tensors, naming one."""
    model = meta_model(tiny_config("llama", num_hidden_layers=3))
    missing = [name for name in model.state_dict() if ".layers.2." in name]
    with pytest.raises(WeightsError) as error:
        open_pretrained(str(saved["llama"]), model)
    assert str(error.value) == (
        f"{saved['llama']} does not match the llama model: it has no value for the model's "
        f"{missing[0]} (and {len(missing) - 1} more); build the model from the config saved "
        "with these weights"
    )


def test_checkpoint_of_more_layers_is_refused_naming_the_first_unexpected_key(
    saved: dict[str, Path],
) -> None:
    """It refuses a checkpoint with tensors the model does not have, naming one and its file."""
    from transformers.core_model_loading import dot_natural_key

    keys = weight_map(saved["mixtral"])
    unexpected = sorted((k for k in keys if ".layers.1." in k), key=dot_natural_key)
    with pytest.raises(WeightsError) as error:
        open_pretrained(
            str(saved["mixtral"]), meta_model(tiny_config("mixtral", num_hidden_layers=1))
        )
    assert str(error.value) == (
        f"{saved['mixtral']} does not match the mixtral model: its {unexpected[0]} (in "
        f"{keys[unexpected[0]]}) is no tensor of the model (and {len(unexpected) - 1} more); "
        "build the model from the config saved with these weights"
    )


def test_checkpoint_of_another_size_is_refused_with_both_shapes(saved: dict[str, Path]) -> None:
    """It refuses a tensor stored in another shape than the model's, giving both."""
    folder = saved["llama"]
    key = "model.layers.0.mlp.gate_proj.weight"
    with pytest.raises(WeightsError) as error:
        open_pretrained(str(folder), meta_model(tiny_config("llama", intermediate_size=48)))
    assert str(error.value) == (
        f"{folder}: {key} (in {weight_map(folder)[key]}) has shape [64, 32], the model's {key} "
        "[48, 32]: build the model from the config saved with these weights"
    )


def test_experts_of_another_size_are_refused_with_both_shapes(saved: dict[str, Path]) -> None:
    """It refuses experts that stack into another shape than the model's, giving both."""
    folder = saved["mixtral"]
    name = "model.layers.0.mlp.experts.gate_up_proj"
    first = "model.layers.0.block_sparse_moe.experts.0.w1.weight"
    with pytest.raises(WeightsError) as error:
        open_pretrained(str(folder), meta_model(tiny_config("mixtral", intermediate_size=48)))
    assert str(error.value) == (
        f"{folder}: {name} made from {first} and 7 more has shape [4, 128, 32], the model's "
        f"{name} [4, 96, 32]: build the model from the config saved with these weights"
    )


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_bf16_checkpoint_fine_tunes_fp32_weights_and_keeps_a_frozen_base_bf16(
    tmp_path: Path, lora: bool
) -> None:
    """It builds a model saved in bf16, by shards and loaded whole alike, with the weights
    that train in fp32 under bf16-mixed (not bf16 masters) and a LoRA base frozen in bf16."""
    from transformers import AutoModelForCausalLM

    from {{ cookiecutter.package_name }}.hf.models import load_decoder
    from {{ cookiecutter.package_name }}.tasks import load_task
    from {{ cookiecutter.package_name }}.training import build_config
    from {{ cookiecutter.package_name }}.training.model import build

    saved = save_tiny_pretrained(tmp_path / "fp32")
    folder = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(saved, dtype=torch.bfloat16).save_pretrained(folder)
    for file in saved.glob("*token*"):
        (folder / file.name).write_bytes(file.read_bytes())
    options = {"model_name": str(folder), "seq_len": 16, "max_bytes": 20_000}
    adapters = {"lora": {"rank": 4, "alpha": 8}} if lora else {}
    settings = {"task": "hf-causal-lm", "accelerator": "cpu", "precision": "bf16-mixed"}
    config = build_config(None, {**settings, "task_options": options, **adapters})
    task = load_task(config.task, config.data, config.task_options)

    for built in (build(task, config), build(task, config, model=load_decoder(str(folder)))):
        params = list(built.model.parameters())
        assert {p.dtype for p in params if p.requires_grad} == {torch.float32}
        frozen = {p.dtype for p in params if not p.requires_grad}
        assert frozen == ({torch.bfloat16} if lora else set())
