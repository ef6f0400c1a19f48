"""The precision modes every backend offers: fp32, bf16 autocast, bf16 weights.

`PrecisionMode` resolves a mode's name (or another tool's alias for it) and casts modules,
inputs and batches as the mode requires. The backend's `Precision` says which device type
its autocast runs on, and what its own modes need besides.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import ClassVar, TypeVar

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
# Accumulators for losses and metrics: never narrower than this.
ACCUMULATOR_DTYPE = torch.float32

_Mode = TypeVar("_Mode", bound="PrecisionMode")


@dataclass(frozen=True)
class PrecisionMode:
    """One precision mode; build it with `from_name`."""

    name: str

    # The modes the backend runs.
    modes: ClassVar[tuple[str, ...]] = MODES

    @classmethod
    def from_name(cls: type[_Mode], name: str | int) -> _Mode:
        """Resolve a mode name or alias; ValueError lists the valid names."""
        text = str(name).strip().lower()
        cls._refuse(name, text)
        if text in ALIASES:
            resolved = ALIASES[text]
            if text.startswith("16"):
                warnings.warn(
                    f"precision {name!r} means {resolved!r} here: TPUs have no fp16 units",
                    stacklevel=2,
                )
            text = resolved
        if text not in cls.modes:
            valid = ", ".join(cls.modes + tuple(ALIASES))
            raise ValueError(f"unknown precision {name!r}: choose one of {valid}")
        return cls(text)

    @classmethod
    def _refuse(cls, name: str | int, text: str) -> None:
        """Raise ValueError, saying what to use instead, for a name the backend will not run."""

    @property
    def legacy_env(self) -> bool:
        """Whether the mode is set in the environment before the runtime starts."""
        return False

    @property
    def param_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.name == "bf16-true" else torch.float32

    def apply_environment(self) -> None:
        """No environment to set: every mode is a dtype or an autocast context."""

    def autocast_device(self) -> str:
        """The device type bf16-mixed autocasts on."""
        raise NotImplementedError

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Cast the module's floating parameters as the mode requires: bf16-true all of them
        to bf16; the other modes the ones that train to fp32, whatever dtype a checkpoint
        stored them in (bf16 master weights would drop every update smaller than 1/256 of
        the weight), the frozen ones (a LoRA base) kept as stored."""
        if self.name == "bf16-true":
            return module.to(torch.bfloat16)
        for param in module.parameters():
            if param.requires_grad and param.is_floating_point() and param.dtype != torch.float32:
                param.data = param.data.to(torch.float32)  # the same Parameter: ties hold
        return module

    def forward_context(self) -> contextlib.AbstractContextManager[None]:
        """Context for forward passes: bf16 autocast under bf16-mixed, nothing otherwise."""
        if self.name == "bf16-mixed":
            return torch.autocast(self.autocast_device(), dtype=torch.bfloat16)
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


def accumulator(device: torch.device | str | None = None) -> torch.Tensor:
    """A zero fp32 scalar for summing losses or metrics on device in any mode."""
    return torch.zeros((), dtype=ACCUMULATOR_DTYPE, device=device)
