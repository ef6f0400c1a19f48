"""`transformers` attention through the project's kernel selection: flash on TPU, SDPA elsewhere.

transformers lets a backend register an attention function by name
(`AttentionInterface.register`) and the mask each forward builds for it
(`AttentionMaskInterface.register`); a model set to that name calls it in every layer. The
function registered here hands the layer's queries, keys and values to
`core.attention.causal_attention`, with the documents read from the `position_ids` every
decoder passes down (a new document wherever a position is not the one before plus one,
transformers' own rule for packed sequences): the Pallas flash kernel on TPU, SDPA with a
block-diagonal causal mask elsewhere. Its mask is only the 2-D padding mask a task may give
(padded tokens become a segment of their own), so no [tokens x tokens] mask is built.

A forward given no `position_ids` (transformers then counts 0, 1, 2, ... in every row) holds
one document per row: its layers attend causally with no mask to build, which on XLA costs
a sixth of a small Llama's step. `watch_positions` notes, at each forward of the model,
whether the caller gave positions; the note holds through that forward's backward (a
recomputed layer attends as it did).

Llama 4's chunked layers attend causally within documents and within chunks of
`attention_chunk_size` tokens, each (document, chunk) pair a segment of its own: chunks of a
document's positions where the caller gives them (a packed document is chunked as it is
alone, as transformers 5.24 chunks it; 5.20 chunked the row), else of the row's tokens from
its first unpadded one. Its decoder layers keep their `position_ids` from their attention:
`pass_positions` hands them on, by a keyword of the project's, so a recomputed layer gets
them again from its own inputs. Layers whose attention is more than that (sliding windows,
logit soft-capping, attention sinks, bidirectional parts) keep transformers' SDPA and its
masks, which honour documents through the same position ids.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from .common import HFConfigError

NAME = "xla_documents"
# Config fields that make attention more than causal within documents, when set.
BEYOND_CAUSAL = ("attn_logit_softcapping",)
CHUNKED = "chunked_attention"  # a layer kind: causal within chunks of attention_chunk_size
# Decoder layers that take `position_ids` and do not pass them to their attention (Llama 4's),
# and the keyword `pass_positions` passes them by.
KEEP_POSITIONS = ("Llama4TextDecoderLayer",)
LAYER_POSITIONS = "xla_position_ids"
_PASSING = "_xla_passes_positions"


def plain_causal(config: Any) -> bool:
    """Whether every layer of a model with `config` attends causally within documents (and
    within chunks, where its layers say so) only."""
    if not getattr(config, "is_causal", True):
        return False
    layer_types = getattr(config, "layer_types", None) or ()
    if any(kind not in ("full_attention", CHUNKED) for kind in layer_types):
        return False
    if getattr(config, "attention_chunk_size", None) and CHUNKED not in layer_types:
        return False  # chunks, but no word of which layers have them
    if any(getattr(config, name, None) for name in BEYOND_CAUSAL):
        return False
    return not (
        getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
    )


# Whether the last forward of a watched model was given position ids (a dict: dynamo traces
# its update inside a compiled step without a graph break, unlike a class attribute's).
_POSITIONS = {"given": True}


def watch_positions(model: nn.Module) -> None:
    """Note, before each forward of `model`, whether its caller gave `position_ids`."""
    names = list(inspect.signature(model.forward).parameters)
    at = names.index("position_ids") if "position_ids" in names else None

    def before(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        given = kwargs.get("position_ids")
        if given is None and at is not None and len(args) > at:
            given = args[at]
        _POSITIONS["given"] = given is not None

    model.register_forward_pre_hook(before, with_kwargs=True)


def pass_positions(model: nn.Module) -> None:
    """Hand the `position_ids` of each decoder layer that keeps them on to its attention."""
    for module in model.modules():
        if type(module).__name__ in KEEP_POSITIONS and not getattr(module, _PASSING, False):
            module.register_forward_pre_hook(_positions_to_attention, with_kwargs=True)
            setattr(module, _PASSING, True)


def _positions_to_attention(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    if kwargs.get("position_ids") is None:
        return None
    return args, {**kwargs, LAYER_POSITIONS: kwargs["position_ids"]}  # on through **kwargs


def register() -> None:
    """Make `NAME` an attention implementation transformers knows (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, documents_attention)
    AttentionMaskInterface.register(NAME, padding_mask)


def padding_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor | None:
    """The task's 2-D padding mask as it is (None without one): read without a device read."""
    return None if attention_mask is None else attention_mask[:, -kv_length:]


def documents_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    position_ids: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """One layer's attention ([batch, heads, tokens, dim] in; [batch, tokens, heads, dim] out,
    as transformers' attention functions return it)."""
    from ..core.attention import causal_attention, document_segments

    if kwargs.get("s_aux") is not None:
        raise HFConfigError(f"{type(module).__name__} has attention sinks: run it with sdpa")
    batch, tokens = query.shape[0], query.shape[2]
    if position_ids is None:
        position_ids = kwargs.get(LAYER_POSITIONS)
    segments = positions = None
    if position_ids is not None and _POSITIONS["given"]:
        positions = position_ids.expand(batch, tokens)
        segments = document_segments(positions)
    chunk = _chunk_size(module)
    if chunk is not None and chunk < tokens:
        shape = (batch, tokens)
        segments = _within_chunks(segments, positions, attention_mask, chunk, shape, query.device)
    if attention_mask is not None:  # padded tokens: a segment of their own, read by no other
        valid = attention_mask.to(torch.bool).expand(batch, tokens)
        base = segments if segments is not None else torch.zeros_like(valid, dtype=torch.int32)
        segments = torch.where(valid, base, torch.full_like(base, -1))
    out = causal_attention(query, key, value, segments, scale=scaling, dropout=dropout)
    return out.transpose(1, 2).contiguous(), None


def _chunk_size(module: Any) -> int | None:
    """The chunk a layer attends within (Llama 4's rotary layers), else None."""
    config: Any = getattr(module, "config", None)
    kinds = getattr(config, "layer_types", None) or ()
    index = getattr(module, "layer_idx", None)
    if index is None or index >= len(kinds) or kinds[index] != CHUNKED:
        return None
    return int(config.attention_chunk_size)


def _within_chunks(
    segments: torch.Tensor | None,
    positions: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    chunk: int,
    shape: tuple[int, int],
    device: torch.device,
) -> torch.Tensor:
    """Segments that also end at every chunk's end: one per (document, chunk) pair."""
    if positions is None:  # one document a row: its tokens, from the first unpadded one
        positions = torch.arange(shape[1], device=device).expand(shape)
        if attention_mask is not None:
            unpadded = attention_mask.to(torch.int32).expand(shape)
            positions = positions - (unpadded.cumsum(-1) == 0).sum(-1, keepdim=True)
    chunks = torch.div(positions, chunk, rounding_mode="floor").to(torch.int32)
    if segments is None:
        return chunks
    return segments * (positions.shape[-1] // chunk + 2) + chunks
