"""Following tensors through a forward pass on the meta device: which ones the mesh's
`tensor` axis splits, which are copies of parameters, and the casts XLA's autocast makes.

A layer whose weight is split on its output dimension (colwise) gives split outputs, and so
does everything computed from them, until a layer whose weight is split on its input
dimension (rowwise: its partial sums are all-reduced), an embedding lookup (reduced over the
vocabulary) or a pinned block output. Under bf16-mixed, XLA's autocast runs matmuls (and
attention, `core/precision.py`) in bf16 and softmaxes in fp32; the meta device has no
autocast, so the tracker makes those casts itself, at the level of the functions models call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves, tree_map_only

# XLA's autocast (AutocastXLA) by cast policy, at the level of the functions models call.
_MATMULS = (F.linear, F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d,
            F.conv_transpose2d, F.conv_transpose3d, F.prelu, F.relu, torch.relu,
            F.scaled_dot_product_attention, torch.matmul, torch.mm, torch.bmm, torch.addmm,
            torch.baddbmm, torch.addbmm, torch.einsum, torch.Tensor.matmul,
            torch.Tensor.__matmul__, torch.Tensor.__rmatmul__, torch.Tensor.mm,
            torch.Tensor.bmm)  # fmt: skip
_FP32 = (F.softmax, F.log_softmax, torch.softmax, torch.log_softmax, torch.Tensor.softmax,
         torch.Tensor.log_softmax, F.batch_norm, F.cross_entropy, F.nll_loss,
         F.binary_cross_entropy)  # fmt: skip
AUTOCAST: dict[Callable[..., Any], torch.dtype] = {
    **dict.fromkeys(_MATMULS, torch.bfloat16),
    **dict.fromkeys(_FP32, torch.float32),
}
# Functions whose second argument is a layer's weight: the tensor axis splits their output
# where it splits that weight's first dimension (an embedding's vocabulary: reduced instead).
_LAYERS = (F.linear, F.conv1d, F.conv2d, F.conv3d, F.embedding)


def storage_key(tensor: torch.Tensor) -> int:
    """One storage's identity while it lives (views share their base's)."""
    return int(tensor.untyped_storage()._cdata)


class ForwardTracker(TorchFunctionMode):
    """Follows which storages the tensor axis splits and which are copies of parameters, and
    applies autocast's casts under bf16-mixed."""

    def __init__(
        self, params: Mapping[int, int], split_weights: Mapping[int, bool], autocast: bool
    ) -> None:
        super().__init__()
        self.params = params  # storage -> parameter index
        self.split_weights = split_weights  # parameter index -> split on its first dim?
        self.autocast = autocast
        self.copies: dict[int, int] = {}  # storage of a parameter's copy -> parameter index
        self.split: dict[int, bool] = {}  # storage -> split over the tensor axis?
        # Tensors a function makes inside and autograd saves (softmax's output inside
        # attention) are never returned: they are split as that function's inputs are.
        self.running_split = False
        self.casts: dict[tuple[int, torch.dtype], torch.Tensor] = {}  # autocast's weight cache
        # Every tensor noted stays alive until the recording ends: a freed storage's address
        # could otherwise come back as another storage's and inherit its notes.
        self.alive: list[torch.Tensor] = []

    def parameter_of(self, tensor: torch.Tensor) -> int | None:
        key = storage_key(tensor)
        return self.params.get(key, self.copies.get(key))

    def is_split(self, tensor: torch.Tensor) -> bool:
        return self.split.get(storage_key(tensor), self.running_split)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        dtype = AUTOCAST.get(func) if self.autocast else None
        if dtype is not None:
            args, kwargs = tree_map_only(
                torch.Tensor, lambda t: self._cast(t, dtype), (args, kwargs)
            )
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        activations = [t for t in inputs if self.parameter_of(t) is None]
        self.running_split = any(self.split.get(storage_key(t), False) for t in activations)
        try:
            out = func(*args, **kwargs)
        finally:
            self.running_split = False
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if inputs and not activations:  # a view or a copy of one parameter
            owners = {self.parameter_of(t) for t in inputs}
            if len(owners) == 1:
                owner = owners.pop()
                for tensor in outputs:
                    self.copies.setdefault(storage_key(tensor), owner)  # type: ignore[arg-type]
                self.alive.extend(outputs)
                return out
        weight = self._layer_weight(func, args, kwargs)
        if weight is not None:
            self.mark(outputs, self.split_weights[weight] and func is not F.embedding)
        else:
            self.mark(outputs, any(self.split.get(storage_key(t), False) for t in activations))
        return out

    def _cast(self, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if not tensor.is_floating_point() or tensor.dtype in (dtype, torch.float64):
            return tensor
        owner = self.parameter_of(tensor)
        if owner is not None:  # autocast casts each weight once per forward
            cached = self.casts.get((owner, dtype))
            if cached is None:
                cached = self.casts[(owner, dtype)] = tensor.to(dtype)
                self.copies[storage_key(cached)] = owner
                self.alive.append(cached)
            return cached
        cast = tensor.to(dtype)
        self.mark([cast], self.split.get(storage_key(tensor), False))
        return cast

    def _layer_weight(self, func: Any, args: Any, kwargs: Any) -> int | None:
        if func not in _LAYERS:
            return None
        weight = args[1] if len(args) > 1 else kwargs.get("weight")
        owner = self.parameter_of(weight) if isinstance(weight, torch.Tensor) else None
        return owner if owner in self.split_weights else None

    def mark(self, tensors: list[torch.Tensor], split: bool) -> None:
        for tensor in tensors:
            self.split[storage_key(tensor)] = split
        self.alive.extend(tensors)
