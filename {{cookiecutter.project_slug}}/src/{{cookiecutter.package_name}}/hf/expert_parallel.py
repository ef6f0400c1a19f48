"""Sharding rules from a transformers model's own expert-parallel plan.

transformers ships each mixture-of-experts model's plan beside its tensor-parallel one
(`config.base_model_ep_plan`: the stacked expert weights `gate_up_proj` and `down_proj`,
[experts, out, in], "grouped_gemm"). Here it becomes rules over the mesh's `expert` axis:
each device holds its experts (the first dimension split over `expert`), and the largest
of their other dimensions is split over `fsdp` as every fsdp parameter is. The batch is
split over `expert` too (`core/sharding.py`), so the layers outside the experts run on a
share of the tokens on every device; XLA's partitioner moves the tokens to their experts.
"""

from __future__ import annotations

import sys
from typing import Any

from torch import nn

from ..core.sharding import Rule, Spec
from .common import HFConfigError, unwrap

SPLIT_EXPERTS = {"grouped_gemm"}


def expert_parallel_plan(model: nn.Module) -> dict[str, str]:
    """The model's plan: parameter pattern -> style (for Llama 4, whose plan later
    transformers dropped, the one of the experts `llama4.py` dispatches)."""
    inner = unwrap(model)
    if inner is None:
        return {}
    plan = dict(getattr(inner.config, "base_model_ep_plan", None) or {})
    if not plan and "transformers.models.llama4.modeling_llama4" in sys.modules:
        from .llama4 import expert_parallel_plan as llama4_plan

        plan = llama4_plan(inner)
    return plan


def expert_parallel_rules(model: nn.Module, expert: int) -> list[Rule]:
    """Rules splitting the plan's expert weights over an `expert` axis of `expert` devices."""
    inner = unwrap(model)
    if inner is None:
        return []
    kind = inner.config.model_type
    plan = {p: s for p, s in expert_parallel_plan(model).items() if s in SPLIT_EXPERTS}
    if not plan:
        raise HFConfigError(
            f"a {kind!r} model has no expert-parallel plan in transformers (no experts to "
            "split): drop the mesh's expert axis"
        )
    names = [name for name, _ in model.named_parameters()]
    shapes = dict(model.named_parameters())
    rules = []
    for pattern in plan:
        matched = [n for n in names if Rule(pattern, ()).matches(n.replace(".base_layer.", "."))]
        if not matched:
            continue
        shape = tuple(shapes[matched[0]].shape)
        if shape[0] % expert:
            raise HFConfigError(
                f"expert={expert} does not divide the model's {shape[0]} experts: choose an "
                f"expert axis that divides {shape[0]}"
            )
        rules.append(Rule(pattern, _expert_spec(shape), required=False))
    return rules


def _expert_spec(shape: tuple[int, ...]) -> Spec:
    """Experts over `expert`; the largest other dimension over `fsdp`."""
    spec: list[Any] = ["expert"] + [None] * (len(shape) - 1)
    if len(shape) > 1:
        rest = list(shape[1:])
        spec[1 + rest.index(max(rest))] = "fsdp"
    return tuple(spec)
