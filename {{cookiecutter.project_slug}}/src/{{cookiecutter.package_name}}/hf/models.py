"""Decoder-only causal LMs from `transformers`: built from a config, or loaded offline.

`build_decoder("llama", sizes)` makes any architecture `AutoModelForCausalLM` knows from
a config (no download); `load_decoder(name)` loads a model from the local Hugging Face
cache or a `save_pretrained` directory. Encoders and encoder-decoders are refused: the
project trains next-token predictors.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from .common import HFConfigError


@dataclass(frozen=True)
class Sizes:
    """The shape of a decoder built from scratch; 0 means the usual default."""

    vocab: int
    positions: int
    dim: int
    layers: int
    heads: int
    kv_heads: int = 0  # 0: as many as heads (no grouped-query attention)
    mlp_dim: int = 0  # 0: 4 x dim
    dropout: float = 0.0
    tie_embeddings: bool | None = None  # None: the architecture's own default
    experts: int = 0  # a mixture of experts' experts per layer (0: the architecture's own)
    experts_per_token: int = 0  # experts each token is routed to (0: the architecture's own)

    def check(self) -> None:
        kv_heads = self.kv_heads or self.heads
        if self.dim % self.heads:
            raise HFConfigError(f"dim {self.dim} is not a multiple of heads {self.heads}")
        if self.heads % kv_heads:
            raise HFConfigError(f"heads {self.heads} is not a multiple of kv_heads {kv_heads}")
        if self.experts and self.experts_per_token > self.experts:
            raise HFConfigError(
                f"experts_per_token {self.experts_per_token} is more than the {self.experts} "
                "experts"
            )

    def config_values(self) -> dict[str, Any]:
        """The sizes under transformers' common config names (and GPT-2's own)."""
        mlp = self.mlp_dim or 4 * self.dim
        values: dict[str, Any] = {
            "vocab_size": self.vocab,
            "max_position_embeddings": self.positions,
            "hidden_size": self.dim,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads or self.heads,
            "head_dim": self.dim // self.heads,
            "intermediate_size": mlp,
            "intermediate_size_mlp": mlp,  # Llama 4's dense layers (its experts': the above)
            "n_inner": mlp,
            # No special token ids: a byte vocabulary has none, and defaults point past it.
            "bos_token_id": None,
            "eos_token_id": None,
            "pad_token_id": None,
        }
        for name in ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop"):
            values[name] = self.dropout
        values["attn_pdrop"] = self.dropout
        if self.tie_embeddings is not None:
            values["tie_word_embeddings"] = self.tie_embeddings
        return values


def architectures() -> list[str]:
    """Every model type `AutoModelForCausalLM` builds that is a decoder-only model."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    return sorted(set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) - set(MODEL_FOR_MASKED_LM_MAPPING_NAMES))


def check_decoder(config: Any, what: str) -> None:
    """Refuse configs that are not decoder-only causal LMs (HFConfigError names the kind)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    kind = config.model_type
    if getattr(config, "is_encoder_decoder", False):
        raise HFConfigError(
            f"{what} is a {kind!r} encoder-decoder model; this task trains decoder-only "
            "causal LMs (llama, qwen2, gemma, mistral, gpt2, ...)"
        )
    if kind in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        raise HFConfigError(
            f"{what} is a {kind!r} encoder (masked LM); this task trains decoder-only "
            "causal LMs (llama, qwen2, gemma, mistral, gpt2, ...)"
        )
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise HFConfigError(f"{what} is a {kind!r} model, which has no causal LM head")


def decoder_config(architecture: str, sizes: Sizes, fields: Mapping[str, Any] | None = None) -> Any:
    """The config of a decoder of `architecture` with these sizes (no download), and `fields`
    of its config set over them (Llama 4's `interleave_moe_layer_step`, a sliding window)."""
    from transformers import AutoConfig

    sizes.check()
    if architecture not in _config_types():
        raise HFConfigError(
            f"unknown architecture {architecture!r}: transformers knows no such model type "
            f"(decoders it builds: {', '.join(architectures()[:12])}, ...)"
        )
    values = sizes.config_values()
    values.update(_expert_values(architecture, sizes))
    values.update(_config_fields(architecture, fields or {}))
    config = AutoConfig.for_model(architecture, **values)
    check_decoder(config, f"architecture {architecture!r}")
    _check_sizes_reach_the_decoder(architecture, config, sizes)
    return config


def _check_sizes_reach_the_decoder(architecture: str, config: Any, sizes: Sizes) -> None:
    """Refuse a composite (multimodal) config whose decoder keeps its own full-size shape."""
    try:
        text = config.get_text_config()
    except ValueError:  # several text configs: none is the decoder's alone
        return
    if text is not config and getattr(text, "hidden_size", sizes.dim) != sizes.dim:
        raise HFConfigError(
            f"architecture {architecture!r} configures a model whose decoder "
            f"({text.model_type!r}) the size options do not reach (it would be built "
            f"{text.hidden_size} wide, as published): use architecture {text.model_type!r}"
        )


# An expert's hidden size by its name in each family (Mixtral and OLMoE use the MLP's).
EXPERT_FIELDS = {
    "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "experts_per_token": ("num_experts_per_tok",),
    "mlp_dim": ("moe_intermediate_size", "shared_expert_intermediate_size"),
}


def _expert_values(architecture: str, sizes: Sizes) -> dict[str, Any]:
    """The mixture-of-experts sizes under the names this architecture's config has."""
    from transformers import CONFIG_MAPPING

    from .moe import declares_experts

    if not (sizes.experts or sizes.experts_per_token):
        return {}
    defaults = CONFIG_MAPPING[architecture]()
    if not declares_experts(defaults):
        raise HFConfigError(
            f"architecture {architecture!r} has no experts: drop experts and "
            "experts_per_token, or choose a mixture of experts (mixtral, qwen2_moe, "
            "qwen3_moe, olmoe, ...)"
        )
    values: dict[str, Any] = {}
    for size, names in EXPERT_FIELDS.items():
        value = getattr(sizes, size) or (4 * sizes.dim if size == "mlp_dim" else 0)
        for name in names:
            if value and hasattr(defaults, name):
                values[name] = value
    return values


def _config_fields(architecture: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """`fields` as given, once each is known to be one of the architecture's config."""
    from transformers import CONFIG_MAPPING

    if not fields:
        return {}
    defaults = CONFIG_MAPPING[architecture]()
    unknown = sorted(name for name in fields if not hasattr(defaults, name))
    if unknown:
        raise HFConfigError(
            f"config_fields: {type(defaults).__name__} has no field {unknown[0]!r} (the "
            f"fields of its config.json are its fields)"
        )
    return dict(fields)


def build_decoder(config: Any) -> nn.Module:
    """A freshly initialised decoder (weights from torch's generator: seed it first)."""
    from transformers import AutoModelForCausalLM

    return _with_sdpa(lambda attention: AutoModelForCausalLM.from_config(
        config, attn_implementation=attention
    ))  # fmt: skip


def _with_sdpa(build: Any) -> nn.Module:
    """`build(attention)` with SDPA, or with the model's eager attention where transformers
    refuses SDPA for it (Gemma2 from transformers 5.24: its logit soft-capping)."""
    try:
        return build("sdpa")  # type: ignore[no-any-return]
    except ValueError as error:
        if "scaled_dot_product_attention" not in str(error):
            raise
        return build("eager")  # type: ignore[no-any-return]


def _config_types() -> set[str]:
    from transformers import CONFIG_MAPPING

    return set(CONFIG_MAPPING.keys())


def missing_from_cache(name: str, what: str) -> HFConfigError:
    return HFConfigError(
        f"model_name {name!r}: its {what} is not in the local Hugging Face cache and nothing is "
        f"downloaded at run time; run `hf download {name}` once with network access "
        "(or set model_name to a directory written by save_pretrained)"
    )


def pretrained_config(name: str) -> Any:
    """The config of a cached or saved model, checked to be a decoder."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError):
        raise missing_from_cache(name, "config") from None
    check_decoder(config, f"model_name {name!r}")
    return config


def load_decoder(name: str) -> nn.Module:
    """A pretrained decoder from the local cache or a save_pretrained directory.

    transformers' loading bar is shown on a terminal only: in logs and captured output it
    is noise between the run's own lines.
    """
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    pretrained_config(name)
    if not sys.stderr.isatty():
        logging.disable_progress_bar()
    try:
        return _with_sdpa(lambda attention: AutoModelForCausalLM.from_pretrained(
            name, local_files_only=True, attn_implementation=attention
        ))  # fmt: skip
    except OSError:
        raise missing_from_cache(name, "weights") from None


def load_tokenizer(name: str) -> Any:
    """The tokenizer saved with a model (a pretrained model is useless without its own)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError, TypeError):
        raise missing_from_cache(name, "tokenizer") from None
