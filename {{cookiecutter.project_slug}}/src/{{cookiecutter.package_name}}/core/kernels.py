"""TPU kernels torch_xla ships (Pallas, written in JAX), behind plain functions: the grouped
matrix multiply that runs a mixture of experts without padding.

`custom_kernel.gmm` multiplies each group of rows by its own matrix: the rows are tokens
sorted by expert, the groups the experts' token counts. It compiles for TPU only (Pallas
has no XLA:CPU backend) and needs `jax` (`pip install 'torch_xla[pallas]'`); under an
SPMD mesh torch_xla gives it no per-device region of its own, so it is offered on one
device (or one per process, ddp) and callers keep a path of plain XLA ops for the rest.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

# The kernel's largest tile; every dimension is cut into tiles that divide it.
_TILE = 512


@functools.cache
def _kernel_installed() -> bool:
    if importlib.util.find_spec("jax") is None:
        return False
    from torch_xla.experimental import custom_kernel

    return hasattr(custom_kernel, "GMM")


def grouped_matmul_ready(tensor: torch.Tensor) -> bool:
    """True where `grouped_matmul` runs on `tensor`: a TPU device, jax installed, no mesh."""
    if tensor.device.type != "xla" or os.environ.get("PJRT_DEVICE", "").upper() != "TPU":
        return False
    import torch_xla.runtime as xr

    return not xr.is_spmd() and _kernel_installed()


def _tile(size: int) -> int:
    """The largest tile of 512, 256 or 128 that divides `size`; else `size` (one tile)."""
    return next((tile for tile in (_TILE, 256, 128) if size % tile == 0), size)


def grouped_matmul(rows: torch.Tensor, weights: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """`rows[start_g:end_g] @ weights[g]` for each group g of `groups` consecutive rows.

    rows [m, k] sorted by group, weights [groups, k, n], groups [groups] (counts summing
    to m). Differentiable (torch_xla's GMM: gmm forward, gmm and tgmm backward). The rows
    are padded to a whole number of tiles, the padding counted in the last group, and cut
    off again.
    """
    from torch_xla.experimental.custom_kernel import GMM

    m, k = rows.shape
    n = weights.shape[-1]
    tile_m = min(_TILE, m)
    padding = -m % tile_m
    if padding:
        rows = torch.cat([rows, rows.new_zeros(padding, k)])
        groups = torch.cat([groups[:-1], groups[-1:] + padding])
    out = GMM.apply(rows, weights, groups.to(torch.int32), (tile_m, _tile(k), _tile(n)))
    return out[:m] if padding else out
