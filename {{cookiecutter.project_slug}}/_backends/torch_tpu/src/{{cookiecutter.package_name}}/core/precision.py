"""Precision modes: fp32, bf16 autocast on the run's device, bf16 weights.

torch_xla's legacy modes (`bf16-env`: XLA_USE_BF16) have no TorchTPU counterpart and are
refused with what to use instead.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch

MODES = ("32-true", "bf16-mixed", "bf16-true")
# Names other tools use; TPUs have no fp16 units, so half precision means bf16 there.
ALIASES = {
    "32": "32-true",
    "fp32": "32-true",
    "bf16": "bf16-mixed",
    "16": "bf16-mixed",
    "16-mixed": "bf16-mixed",
    "16-true": "bf16-true",
}
LEGACY = ("bf16-env", "bf16-env-downcast")
# Accumulators for losses and metrics: never narrower than this.
ACCUMULATOR_DTYPE = torch.float32


def _device_type() -> str:
    from .runtime import device

    return str(device().type)


@dataclass(frozen=True)
class Precision:
    """One precision mode; build it with `Precision.from_name`."""

    name: str

    @classmethod
    def from_name(cls, name: str | int) -> Precision:
        """Resolve a mode name or alias; ValueError lists the valid names."""
        text = str(name).strip().lower()
        if text in LEGACY:
            raise ValueError(
                f"precision {name!r} is torch_xla's XLA_USE_BF16 mode, which TorchTPU does "
                "not have: use bf16-true (bf16 weights) or bf16-mixed (autocast)"
            )
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
        return False

    @property
    def param_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.name == "bf16-true" else torch.float32

    def apply_environment(self) -> None:
        """No environment to set: every mode is a dtype or an autocast context."""

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Cast the module's floating parameters as the mode requires (bf16-true only)."""
        if self.name == "bf16-true":
            return module.to(torch.bfloat16)
        return module

    def forward_context(self) -> contextlib.AbstractContextManager[None]:
        """Context for forward passes: autocast to bf16 on the run's device (bf16-mixed)."""
        if self.name == "bf16-mixed":
            return torch.autocast(_device_type(), dtype=torch.bfloat16)
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


def autocast_attention() -> None:
    """Nothing to register: PyTorch's autocast casts SDPA's inputs on every device."""


def accumulator(device: torch.device | str | None = None) -> torch.Tensor:
    """A zero fp32 scalar for summing losses or metrics on device in any mode."""
    return torch.zeros((), dtype=ACCUMULATOR_DTYPE, device=device)


@contextlib.contextmanager
def fp32_accumulation() -> Iterator[None]:
    """Leave autocast for reductions that must stay fp32."""
    with torch.autocast(_device_type(), enabled=False):
        yield
