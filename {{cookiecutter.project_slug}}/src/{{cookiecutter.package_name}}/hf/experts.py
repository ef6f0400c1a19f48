"""A mixture of experts computed with static shapes: transformers' experts, one graph on XLA.

transformers 5 runs every MoE model's experts through a function chosen by name
(`config._experts_implementation`, `transformers.integrations.moe.ExpertsInterface`). Its
own do not suit XLA: `grouped_mm` counts tokens per expert with `torch.histc` on integers
(no XLA lowering: it runs on the host and fails), `eager` loops over the experts a batch
happens to hit (`nonzero`: a device read and a new graph per routing pattern), and
`batched_mm` copies an expert's weight matrices for every routed token. `xla_experts`,
registered as "xla", keeps every shape fixed:

- Dispatch: the (token, expert) pairs are sorted by expert (stably: earlier tokens first)
  and each expert takes at most `capacity` of them into an [experts, capacity, hidden]
  buffer; the experts run as batched matrix products over it.
- Combine: each pair gathers its row back (the inverse of the dispatch), weighted by its
  routing weight, and a token sums its pairs. A pair over capacity gets zeros: its token
  passes that expert by the layer's residual connection, and is counted as dropped.
  Llama 4 weighs a pair's input instead of its output (`weigh_inputs`, `llama4.py`).

`capacity = ceil(capacity_factor x tokens x top_k / experts)`; `capacity_factor = 0` is
dropless (every expert may take every token), which gives transformers' own results. On
a TPU device without a mesh, torch_xla's grouped matmul kernel (`core/kernels.py`) runs
the experts dropless instead, without padding. On the meta device (FLOPs, `plan`), the
capacity is the mean load, so what is counted is what the routed tokens compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..core import kernels

NAME = "xla"
SETTINGS = "_xla_routing"  # the experts module's Routing
LOADS = "_xla_loads"  # the last forward's (tokens per expert [experts], pairs kept [])


@dataclass(frozen=True)
class Routing:
    """How the experts take their tokens: the capacity factor (0: dropless) and whether the
    grouped matmul kernel runs where it can."""

    capacity_factor: float = 0.0
    grouped_matmul: bool = True

    def capacity(self, tokens: int, pairs: int, experts: int) -> int:
        if self.capacity_factor <= 0:
            return tokens  # an expert is chosen at most once per token
        return max(1, min(tokens, math.ceil(self.capacity_factor * pairs / experts)))


def xla_experts(
    self: Any,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    weigh_inputs: bool = False,
) -> torch.Tensor:
    """The experts' output for each token ([tokens, hidden]), as transformers' own compute it:
    each pair's output weighted, or (`weigh_inputs`, Llama 4's) its input."""
    routing: Routing = getattr(self, SETTINGS, Routing())
    tokens, top_k = top_k_index.shape
    pairs, experts = tokens * top_k, self.num_experts
    # The rows the experts take, and the row of each pair (a pair of the sorted order o
    # takes row o // step): the tokens, or each pair's token scaled by its weight.
    rows, step = hidden_states, top_k
    if weigh_inputs:
        weights = top_k_weights.to(hidden_states.dtype).unsqueeze(-1)
        rows, step = (hidden_states.unsqueeze(1) * weights).reshape(pairs, -1), 1
    out_weights = None if weigh_inputs else top_k_weights
    expert_of = top_k_index.reshape(-1)
    order = torch.argsort(expert_of, stable=True)  # pairs grouped by expert
    ones = torch.ones_like(expert_of)
    loads = torch.zeros(experts, dtype=expert_of.dtype, device=expert_of.device)
    loads = loads.scatter_add(0, expert_of, ones)
    if hidden_states.device.type == "meta":
        capacity = math.ceil(pairs / experts)
    elif routing.grouped_matmul and kernels.grouped_matmul_ready(hidden_states):
        setattr(self, LOADS, (loads, ones.sum()))
        grouped = lambda x, w: kernels.grouped_matmul(x, w, loads)  # noqa: E731
        out = _experts(self, rows[order // step], expert_of[order], grouped)
        restored = torch.empty_like(out).index_copy(0, order, out)
        return _combine(restored, top_k, out_weights, hidden_states.dtype)
    else:
        capacity = routing.capacity(tokens, pairs, experts)
    sorted_expert = expert_of[order]
    starts = torch.cumsum(loads, 0) - loads
    rank = torch.arange(pairs, device=expert_of.device) - starts[sorted_expert]
    kept = rank < capacity
    spare = experts * capacity  # the slot of every dropped pair: zeros, cut off
    slot_sorted = torch.where(kept, sorted_expert * capacity + rank, spare)
    slot = torch.empty_like(slot_sorted).scatter(0, order, slot_sorted)  # each pair's slot
    row_of_slot = slot.new_full((spare + 1,), rows.shape[0])  # an empty slot: the zero row
    row_of_slot = row_of_slot.scatter(0, slot_sorted, order // step)[:spare]
    padded = torch.cat([rows, rows.new_zeros(1, rows.shape[-1])])
    buffer = padded[row_of_slot].view(experts, capacity, -1)
    ids = torch.arange(experts, device=expert_of.device).repeat_interleave(capacity)
    out = _experts(self, buffer, ids.view(experts, capacity), torch.bmm)
    setattr(self, LOADS, (loads, kept.sum()))
    out = torch.cat([out.reshape(spare, -1), out.new_zeros(1, out.shape[-1])])
    return _combine(out[slot], top_k, out_weights, hidden_states.dtype)


def _combine(
    per_pair: torch.Tensor, top_k: int, weights: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    """Each token's pairs (in pair order, [tokens x top_k, hidden]) weighted (unless their
    inputs were) and summed."""
    if weights is not None:
        per_pair = per_pair * weights.reshape(-1, 1).to(per_pair.dtype)
    return per_pair.view(-1, top_k, per_pair.shape[-1]).sum(dim=1).to(dtype)


def _experts(self: Any, x: torch.Tensor, expert_ids: torch.Tensor, matmul: Any) -> torch.Tensor:
    """The experts' MLP on rows `x` ([experts, capacity, in], or [rows, in] sorted by expert
    for the grouped kernel), with each row's expert id for the biases."""
    if self.has_gate:
        out = _linear(self, x, expert_ids, "gate_up_proj", matmul)
        out = self._apply_gate(out)
    else:
        out = self.act_fn(_linear(self, x, expert_ids, "up_proj", matmul))
    out = _linear(self, out, expert_ids, "down_proj", matmul)
    if self.has_post_expert_norm:
        out = self.post_expert_norm(out)
    return out


def _linear(self: Any, x: torch.Tensor, expert_ids: torch.Tensor, name: str, matmul: Any) -> Any:
    weight = getattr(self, name)  # [experts, out, in], or [experts, in, out] when transposed
    out = matmul(x, weight if self.is_transposed else weight.transpose(1, 2))
    if self.has_bias:
        out = out + getattr(self, f"{name}_bias")[expert_ids]
    return out


def register() -> None:
    """Make "xla" an experts implementation transformers knows (idempotent)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if NAME not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(NAME, xla_experts)
