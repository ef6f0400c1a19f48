"""Hugging Face `transformers` models: what the project does for any decoder, in one place.

The training loop, evaluation and export call these for every model; they act only on
`transformers` models (and `peft` LoRA around them), so a task of your own that returns
`AutoModelForCausalLM.from_config(...)` gets the same treatment as the example. Nothing
here imports `transformers` unless the model came from it: projects without it work alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from torch import nn

from .common import HFConfigError, is_hf_model, unwrap

if TYPE_CHECKING:
    from .moe import MoeSettings

__all__ = [
    "HFConfigError",
    "block_class",
    "generation_mode",
    "is_hf_model",
    "prepare",
    "unwrap",
]


def prepare(model: nn.Module, moe: MoeSettings | None = None) -> nn.Module:
    """Make a `transformers` model train at XLA speed; other models pass through untouched.

    - Attention masks are built without reading the device (`masks.static_masks`):
      one graph per step, no host sync, in its own forward.
    - The key/value cache is off: training never reuses it, and with activation
      checkpointing a recomputed layer would append to it a second time.
    - Attention stays inside each document (`position_ids` that restart at each one): a
      causal decoder runs the project's attention (`attention.py`: Pallas flash attention
      on TPU, SDPA elsewhere; causal alone when the forward is given no positions); one
      with sliding windows or other extras, transformers' SDPA
      and its masks.
    - Mixtures of experts compute their experts with static shapes, and return their
      router's load-balancing loss while training (`moe.py`, with `moe`'s settings).
    - Ops some models use that the backend would run on the host get kernels of their
      own (`core.ops.lower_host_ops`: Llama 4's complex rotary embeddings).
    """
    inner = unwrap(model)
    if inner is None:
        return model
    from ..core import ops
    from .attention import NAME, pass_positions, plain_causal, register, watch_positions
    from .masks import static_masks
    from .moe import prepare_experts

    static_masks()
    ops.lower_host_ops()
    prepare_experts(model, moe)
    inner.config.use_cache = False
    if plain_causal(inner.config):
        register()
        inner.set_attn_implementation(NAME)
        watch_positions(inner)
        pass_positions(inner)
    elif inner.config._attn_implementation not in ("sdpa", "eager"):
        inner.set_attn_implementation("sdpa")
    return model


def block_class(model: nn.Module) -> type[nn.Module] | None:
    """The model's repeated decoder layer, from `_no_split_modules` (what fsdp wraps)."""
    inner = unwrap(model)
    names = set(getattr(inner, "_no_split_modules", None) or ()) if inner is not None else set()
    for module in model.modules():
        if type(module).__name__ in names:
            return type(module)
    return None


@contextlib.contextmanager
def generation_mode(model: nn.Module) -> Iterator[None]:
    """Run `model` as generation needs, then as before: in eval mode, attention through
    transformers' SDPA (whose masks read the static cache's positions; without reading the
    device, as in training), and a mixture's experts dropless (no token over a capacity:
    the next token is the one transformers' own experts give)."""
    inner = unwrap(model)
    if inner is None:
        yield
        return
    from .experts import SETTINGS, Routing
    from .masks import static_masks
    from .moe import experts_modules

    static_masks()
    training = model.training
    attention = inner.config._attn_implementation
    experts = experts_modules(model)
    routings: list[Any] = [getattr(module, SETTINGS, None) for module in experts]
    model.eval()
    if attention != "sdpa":
        inner.set_attn_implementation("sdpa")
    for module, routing in zip(experts, routings, strict=True):
        grouped = routing.grouped_matmul if routing is not None else True
        setattr(module, SETTINGS, Routing(0.0, grouped))
    try:
        yield
    finally:
        for module, routing in zip(experts, routings, strict=True):
            if routing is None:
                delattr(module, SETTINGS)
            else:
                setattr(module, SETTINGS, routing)
        if attention != "sdpa":
            inner.set_attn_implementation(attention)
        model.train(training)
