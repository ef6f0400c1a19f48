"""Llama 4's mixture (`llama4_text`: Scout, Maverick) through the static experts.

transformers' `Llama4TextMoe` computes its experts outside the experts interface: it repeats
every token once per expert, scales each copy by the router's score for that expert (the
sigmoid of the token's top-k logits, zero for the others) and runs `Llama4TextExperts` as
two batched matmuls over every copy: E times the routed work, on E copies of the tokens.
An expert given zeros returns zeros (it has no biases), so the layer is its shared expert
plus, for each of a token's top-k experts, that expert applied to the token times its score.
`adopt` makes each such layer compute exactly that: its router and shared expert run as they
are, its experts go through `experts.xla_experts` (top-k dispatch with a capacity, the
`expert` mesh axis) with the scores applied to their inputs. The experts' stacked weights,
`gate_up_proj` [experts, hidden, 2 x expert_dim] and `down_proj` [experts, expert_dim,
hidden], are [experts, in, out]: the experts interface's transposed layout. Parameter names,
weights and checkpoints are unchanged: the modules only change class, to subclasses of
transformers' own that override `forward`.

transformers' Llama 4 defines no load-balancing loss (its forward returns the router logits
and no `aux_loss`), so none is added: `router_metrics` report the experts' loads and drops.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.models.llama4.modeling_llama4 import Llama4TextExperts, Llama4TextMoe

from .experts import xla_experts

# What transformers' `use_experts_implementation(is_transposed=True)` sets on each experts
# module: the static experts (and the rest of the project) read a module's layout from it.
INTERFACE = {
    "has_gate": True,
    "has_bias": False,
    "has_post_expert_norm": False,
    "is_transposed": True,
    "is_concatenated": True,
    "_is_expert_parallel": False,
}
# The stacked weights the `expert` axis splits: transformers 5.20's `base_model_ep_plan`,
# which later versions dropped (their experts take every token, so nothing is dispatched).
EXPERT_PARALLEL_PLAN = {
    "layers.*.feed_forward.experts.gate_up_proj": "grouped_gemm",
    "layers.*.feed_forward.experts.down_proj": "grouped_gemm",
}


class StaticLlama4TextExperts(Llama4TextExperts):
    """Llama 4's experts on their routed tokens only, each token scaled by its score."""

    def forward(  # type: ignore[override]
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        return xla_experts(self, hidden_states, top_k_index, top_k_weights, weigh_inputs=True)

    def _apply_gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return up * self.act_fn(gate)


class StaticLlama4TextMoe(Llama4TextMoe):
    """Llama 4's mixture layer with its experts top-k dispatched (`StaticLlama4TextExperts`)."""

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        scores, logits = self.router(hidden_states)  # [tokens, experts]: zero off the top-k
        top_k_index = torch.topk(logits, self.top_k, dim=1).indices  # the router's choice
        routed = self.experts(hidden_states, top_k_index, scores.gather(1, top_k_index))
        return self.shared_expert(hidden_states) + routed, logits


def has_llama4_experts(model: nn.Module) -> bool:
    """Whether `model` holds transformers' Llama 4 mixture layers (adopted or not)."""
    return any(isinstance(module, Llama4TextMoe) for module in model.modules())


def adopt(model: nn.Module) -> None:
    """Run every Llama 4 mixture layer of `model` through the static experts (idempotent)."""
    for module in model.modules():
        if isinstance(module, Llama4TextMoe) and not isinstance(module, StaticLlama4TextMoe):
            module.__class__ = StaticLlama4TextMoe
            experts: Any = module.experts
            experts.__class__ = StaticLlama4TextExperts
            for name, value in INTERFACE.items():
                setattr(experts, name, value)  # in the instance, where `experts_modules` looks


def expert_parallel_plan(model: nn.Module) -> dict[str, str]:
    """The plan of the stacked weights the static experts dispatch to (empty: none here)."""
    if any(isinstance(module, StaticLlama4TextExperts) for module in model.modules()):
        return dict(EXPERT_PARALLEL_PLAN)
    return {}
