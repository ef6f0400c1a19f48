"""Sharding rules from a transformers model's own tensor-parallel plan.

transformers ships each decoder's plan (`config.base_model_tp_plan`: q/k/v, gate and up
projections "colwise", o and down projections "rowwise"; the model class's `_tp_plan` for
the output head) and applies it only on GPUs, through DTensor. Here it becomes rules over
the mesh's axes: a colwise Linear's weight [out, in] splits `out` over `tensor` (each
device computes its heads) and `in` over `fsdp`; a rowwise one the other way round (the
partial sums meet in one all-reduce per block). Entries the project does not map (norms
replicated with their gradients reduced, experts) keep the fsdp layout.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..core.sharding import Rule, Spec
from .common import HFConfigError, unwrap

# Styles whose weight ([out, in], or an embedding's [vocab, dim]) splits its first dimension
# over `tensor`, and styles that split the second.
SPLIT_OUTPUT = {
    "colwise",
    "colwise_gather_output",
    "colwise_rep",
    "packed_colwise",
    "embedding_rowwise",
}
SPLIT_INPUT = {"rowwise", "rowwise_split_input", "packed_rowwise"}
WEIGHTS: dict[str, Spec] = {"split_output": ("tensor", "fsdp"), "split_input": ("fsdp", "tensor")}
BIASES: dict[str, Spec] = {"split_output": ("tensor",), "split_input": (None,)}


def tensor_parallel_plan(model: nn.Module) -> dict[str, str]:
    """The model's plan: module pattern -> style (the base model's, then the head's)."""
    inner = unwrap(model)
    if inner is None:
        return {}
    plan = dict(getattr(inner.config, "base_model_tp_plan", None) or {})
    plan.update(getattr(type(inner), "_tp_plan", None) or {})
    return plan


def tensor_parallel_rules(model: nn.Module, tensor: int) -> list[Rule]:
    """Rules splitting the plan's layers over a `tensor` axis of `tensor` devices."""
    inner = unwrap(model)
    if inner is None:
        return []
    _check_heads(inner.config, tensor)
    rules = []
    for pattern, style in tensor_parallel_plan(model).items():
        if style not in SPLIT_OUTPUT | SPLIT_INPUT:
            continue
        kind = "split_output" if style in SPLIT_OUTPUT else "split_input"
        rules.append(Rule(f"{pattern}.weight", WEIGHTS[kind], required=False))
        rules.append(Rule(f"{pattern}.bias", BIASES[kind], required=False))
    if not rules:
        raise HFConfigError(
            f"a {inner.config.model_type!r} model has no tensor-parallel plan in transformers: "
            "drop the mesh's tensor axis, or give sharding_rules"
        )
    return rules


def _check_heads(config: Any, tensor: int) -> None:
    """Each device must hold whole attention heads (and whole key/value heads)."""
    for field in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(config, field, None)
        if isinstance(heads, int) and heads % tensor:
            raise HFConfigError(
                f"tensor={tensor} does not divide the model's {heads} heads ({field}): choose "
                "a tensor size that divides both num_attention_heads and num_key_value_heads"
            )
