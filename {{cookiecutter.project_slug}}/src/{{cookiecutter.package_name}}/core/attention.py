"""Causal attention that stays inside each document, by the kernel the device runs best.

- TPU (with `jax`, `pip install 'torch_xla[pallas]'`): torch_xla's Pallas flash attention
  (`custom_kernel.flash_attention`), causal, the documents given as segment ids, never a
  score matrix; under a mesh it runs on each device's block (`partition_spec`): the batch
  over the batch axes, the heads over `context` and `tensor` (a `context` axis hands each
  device whole sequences of its share of the heads: XLA's all-to-all, and back).
- Elsewhere (XLA:CPU, a TPU without jax, dropout): PyTorch's SDPA with a block-diagonal
  causal mask built from the segment ids; under a `context` axis the queries stay split
  over the tokens and the keys and values are gathered whole.
- The meta device (`plan`): what the flash kernel keeps for the backward pass (queries,
  keys, values, output and two per-row statistics), so a plan counts no score matrix.

Documents come as positions that restart at each one (`document_segments`): every shape is
static and nothing is read from the device, so the step stays one graph.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
from typing import Any

import torch
import torch.nn.functional as F

from .sharding import BATCH_AXES, SEQUENCE_AXIS

FLASH, SDPA = "flash", "sdpa"


def document_segments(positions: torch.Tensor) -> torch.Tensor:
    """Which document each token belongs to (int32, [batch, tokens]), from its position in
    that document: a new one starts wherever a position is not the one before plus one
    (transformers' rule for packed sequences)."""
    step = positions[:, 1:] - positions[:, :-1]
    starts = torch.cat([torch.zeros_like(positions[:, :1]), (step != 1).to(positions.dtype)], 1)
    return starts.cumsum(-1).to(torch.int32)


@functools.cache
def _flash_installed() -> bool:
    if importlib.util.find_spec("jax") is None:
        return False
    from torch_xla.experimental import custom_kernel

    return hasattr(custom_kernel, "flash_attention")


def kernel_for(tensor: torch.Tensor, dropout: float = 0.0) -> str:
    """The attention kernel `causal_attention` runs on `tensor`'s device: FLASH on a TPU with
    the Pallas kernels installed (and no dropout, which the kernel lacks), else SDPA."""
    on_tpu = os.environ.get("PJRT_DEVICE", "").upper() == "TPU"
    if tensor.device.type == "xla" and on_tpu and dropout == 0.0 and _flash_installed():
        return FLASH
    return SDPA


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    segments: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Causal attention of q [batch, heads, tokens, dim] over k, v [batch, kv_heads, tokens,
    dim] (kv_heads dividing heads: grouped-query attention), each token attending only to
    the tokens of its own segment (`document_segments`; None: one document per row)."""
    if k.shape[1] != q.shape[1]:  # each key/value head serves a run of query heads
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if q.device.type == "meta":
        return _FlashFootprint.apply(q, k, v)  # type: ignore[no-any-return]
    if kernel_for(q, dropout) == FLASH:
        from torch_xla.experimental.custom_kernel import flash_attention

        # One dtype for the kernel: autocast's where it runs (rotary embeddings leave the
        # queries and keys in fp32 while the values come from a bf16 matmul).
        dtype = torch.get_autocast_dtype("xla") if torch.is_autocast_enabled("xla") else q.dtype
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        return flash_attention(**flash_arguments(q, k, v, segments, scale))  # type: ignore[no-any-return]
    return _sdpa(q, k, v, segments, scale, dropout)


def _mesh() -> Any:
    """The SPMD mesh in use (set by the spmd and fsdp strategies), or None."""
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    return xs.get_global_mesh() if xr.is_spmd() else None


def _layout(mesh: Any, heads: int, split_heads: tuple[str, ...]) -> tuple[Any, Any]:
    """(batch entry, heads entry) of a [batch, heads, tokens, dim] spec on `mesh`: the batch
    over the batch axes, the heads over those of `split_heads` that divide them."""
    sizes = dict(zip(mesh.axis_names, mesh.mesh_shape, strict=True))
    batch = tuple(axis for axis in mesh.axis_names if axis in BATCH_AXES and sizes[axis] > 1)
    over: list[str] = []
    for axis in split_heads:
        if (
            sizes.get(axis, 1) > 1
            and heads % (math.prod(sizes[a] for a in over) * sizes[axis]) == 0
        ):
            over.append(axis)

    def entry(axes: tuple[str, ...] | list[str]) -> Any:
        return None if not axes else axes[0] if len(axes) == 1 else tuple(axes)

    return entry(batch), entry(over)


def flash_arguments(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    segments: torch.Tensor | None,
    scale: float,
) -> dict[str, Any]:
    """The arguments `custom_kernel.flash_attention` takes for these tensors: causal, the
    segment ids of queries and keys (the same tokens), the softmax scale, and under a mesh
    the block each device runs (`partition_spec`: batch, heads, whole tokens, whole dim)."""
    mesh = _mesh() if q.device.type == "xla" else None
    spec = None
    if mesh is not None:
        batch, heads = _layout(mesh, q.shape[1], (SEQUENCE_AXIS, "tensor"))
        spec = (batch, heads, None, None)
    return {
        "q": q,
        "k": k,
        "v": v,
        "causal": True,
        "q_segment_ids": segments,
        "kv_segment_ids": segments,
        "sm_scale": scale,
        "partition_spec": spec,
        "mesh": mesh,
    }


def document_mask(segments: torch.Tensor) -> torch.Tensor:
    """[batch, 1, tokens, tokens], True where a query may attend to a key: an earlier (or the
    same) token of its own document."""
    tokens = segments.shape[-1]
    causal = torch.ones(tokens, tokens, dtype=torch.bool, device=segments.device).tril()
    same = segments[:, :, None] == segments[:, None, :]
    return (same & causal)[:, None]


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    segments: torch.Tensor | None,
    scale: float,
    dropout: float,
) -> torch.Tensor:
    mesh = _mesh() if q.device.type == "xla" else None
    if mesh is not None and SEQUENCE_AXIS in mesh.axis_names:
        # Each device keeps its stretch of queries and gathers every key and value: the
        # scores it holds are its queries' rows, a `context`-th of them.
        import torch_xla.distributed.spmd as xs

        batch, heads = _layout(mesh, q.shape[1], ("tensor",))
        xs.mark_sharding(q, mesh, (batch, heads, SEQUENCE_AXIS, None))
        xs.mark_sharding(k, mesh, (batch, heads, None, None))
        xs.mark_sharding(v, mesh, (batch, heads, None, None))
    if segments is None:
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, is_causal=True, scale=scale
        )
    mask = document_mask(segments)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale)


class _FlashFootprint(torch.autograd.Function):
    """On the meta device: an output shaped like the queries, and for the backward pass what
    the flash kernel saves (queries, keys, values, output, and its two per-row statistics)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(q)
        rows = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, rows, torch.empty_like(rows))
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v = ctx.saved_tensors[:3]
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
