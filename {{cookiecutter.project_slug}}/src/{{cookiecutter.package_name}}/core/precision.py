"""Precision modes for XLA: fp32, bf16 autocast, bf16 weights, and the legacy env mode."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from . import precision_modes
from .precision_modes import ACCUMULATOR_DTYPE as ACCUMULATOR_DTYPE
from .precision_modes import ALIASES as ALIASES
from .precision_modes import PrecisionMode
from .precision_modes import accumulator as accumulator

_LEGACY_ENV = {"bf16-env": "XLA_USE_BF16", "bf16-env-downcast": "XLA_DOWNCAST_BF16"}
MODES = (*precision_modes.MODES, *_LEGACY_ENV)


class Precision(PrecisionMode):
    """One precision mode; build it with `Precision.from_name`."""

    modes = MODES

    @property
    def legacy_env(self) -> bool:
        return self.name in _LEGACY_ENV

    def apply_environment(self) -> None:
        """Set (or clear) the legacy bf16 variables; must run before the runtime starts."""
        for variable in _LEGACY_ENV.values():
            os.environ.pop(variable, None)
        if self.legacy_env:
            os.environ[_LEGACY_ENV[self.name]] = "1"

    def autocast_device(self) -> str:
        """XLA autocast, whatever the XLA device."""
        return "xla"

    def forward_context(self) -> contextlib.AbstractContextManager[None]:
        """Context for forward passes: XLA autocast under bf16-mixed, nothing otherwise."""
        if self.name == "bf16-mixed":
            autocast_attention()
        return super().forward_context()


_AUTOCAST_LIBRARY: list[torch.library.Library] = []  # kept alive: it holds the registration


def autocast_attention() -> None:
    """Run SDPA in the autocast dtype under XLA autocast, as CUDA's autocast does.

    torch_xla's autocast leaves `scaled_dot_product_attention` out of its cast list, so
    a model whose query and key leave fp32 rotary embeddings (Llama, Qwen2, Gemma, ...)
    while its value comes from a bf16 projection fails: "Expected query, key, and value
    to have the same dtype". This kernel casts all three (once per process).
    """
    if _AUTOCAST_LIBRARY:
        return

    def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: object,
             **kwargs: object) -> torch.Tensor:  # fmt: skip
        dtype = torch.get_autocast_dtype("xla")
        with torch.autocast("xla", enabled=False):
            return torch.ops.aten.scaled_dot_product_attention(  # type: ignore[no-any-return]
                query.to(dtype), key.to(dtype), value.to(dtype), *args, **kwargs
            )

    library = torch.library.Library("aten", "IMPL")
    library.impl("scaled_dot_product_attention", sdpa, "AutocastXLA")
    _AUTOCAST_LIBRARY.append(library)


@contextlib.contextmanager
def fp32_accumulation() -> Iterator[None]:
    """Leave autocast for reductions that must stay fp32."""
    with torch.autocast("xla", enabled=False):
        yield
