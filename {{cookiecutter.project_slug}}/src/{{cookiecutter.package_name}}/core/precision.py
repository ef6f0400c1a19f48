"""Precision modes for XLA: fp32, bf16 autocast, bf16 weights, and the legacy env mode."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch

MODES = ("32-true", "bf16-mixed", "bf16-true", "bf16-env", "bf16-env-downcast")
# Names other tools use; TPUs have no fp16 units, so half precision means bf16 there.
ALIASES = {
    "32": "32-true",
    "fp32": "32-true",
    "bf16": "bf16-mixed",
    "16": "bf16-mixed",
    "16-mixed": "bf16-mixed",
    "16-true": "bf16-true",
}
_LEGACY_ENV = {"bf16-env": "XLA_USE_BF16", "bf16-env-downcast": "XLA_DOWNCAST_BF16"}
# Accumulators for losses and metrics: never narrower than this.
ACCUMULATOR_DTYPE = torch.float32


@dataclass(frozen=True)
class Precision:
    """One precision mode; build it with `Precision.from_name`."""

    name: str

    @classmethod
    def from_name(cls, name: str | int) -> Precision:
        """Resolve a mode name or alias; ValueError lists the valid names."""
        text = str(name).strip().lower()
        if text in ALIASES:
            resolved = ALIASES[text]
            if text.startswith("16"):
                warnings.warn(
                    f"precision {name!r} means {resolved!r} here: TPUs have no fp16 units",
                    stacklevel=2,
                )
            text = resolved
        if text not in MODES:
            valid = ", ".join(MODES + tuple(ALIASES))
            raise ValueError(f"unknown precision {name!r}: choose one of {valid}")
        return cls(text)

    @property
    def legacy_env(self) -> bool:
        return self.name in _LEGACY_ENV

    @property
    def param_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.name == "bf16-true" else torch.float32

    def apply_environment(self) -> None:
        """Set (or clear) the legacy bf16 variables; must run before the runtime starts."""
        for variable in _LEGACY_ENV.values():
            os.environ.pop(variable, None)
        if self.legacy_env:
            os.environ[_LEGACY_ENV[self.name]] = "1"

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Cast the module's floating parameters as the mode requires (bf16-true only)."""
        if self.name == "bf16-true":
            return module.to(torch.bfloat16)
        return module

    def forward_context(self) -> contextlib.AbstractContextManager[None]:
        """Context for forward passes: XLA autocast under bf16-mixed, nothing otherwise."""
        if self.name == "bf16-mixed":
            autocast_attention()
            return torch.autocast("xla", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def convert_input(self, tensor: torch.Tensor) -> torch.Tensor:
        """Cast floating inputs to the parameter dtype (bf16-true only)."""
        if self.name == "bf16-true" and tensor.is_floating_point():
            return tensor.to(torch.bfloat16)
        return tensor

    def convert_batch(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Cast a batch's floating inputs (bf16-true); other modes return it untouched."""
        if self.name != "bf16-true":
            return batch
        return {key: self.convert_input(value) for key, value in batch.items()}


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


def accumulator(device: torch.device | str | None = None) -> torch.Tensor:
    """A zero fp32 scalar for summing losses or metrics on device in any mode."""
    return torch.zeros((), dtype=ACCUMULATOR_DTYPE, device=device)


@contextlib.contextmanager
def fp32_accumulation() -> Iterator[None]:
    """Leave autocast for reductions that must stay fp32."""
    with torch.autocast("xla", enabled=False):
        yield
