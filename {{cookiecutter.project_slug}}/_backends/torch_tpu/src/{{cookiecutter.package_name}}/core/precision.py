"""Precision modes: fp32, bf16 autocast on the run's device, bf16 weights.

torch_xla's legacy modes (`bf16-env`: XLA_USE_BF16) have no TorchTPU counterpart and are
refused with what to use instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .precision_modes import ACCUMULATOR_DTYPE as ACCUMULATOR_DTYPE
from .precision_modes import ALIASES as ALIASES
from .precision_modes import MODES as MODES
from .precision_modes import PrecisionMode
from .precision_modes import accumulator as accumulator

LEGACY = ("bf16-env", "bf16-env-downcast")


def _device_type() -> str:
    from .runtime import device

    return str(device().type)


class Precision(PrecisionMode):
    """One precision mode; build it with `Precision.from_name`."""

    @classmethod
    def _refuse(cls, name: str | int, text: str) -> None:
        if text in LEGACY:
            raise ValueError(
                f"precision {name!r} is torch_xla's XLA_USE_BF16 mode, which TorchTPU does "
                "not have: use bf16-true (bf16 weights) or bf16-mixed (autocast)"
            )

    def autocast_device(self) -> str:
        """The run's device type."""
        return _device_type()


def autocast_attention() -> None:
    """Nothing to register: PyTorch's autocast casts SDPA's inputs on every device."""


@contextlib.contextmanager
def fp32_accumulation() -> Iterator[None]:
    """Leave autocast for reductions that must stay fp32."""
    with torch.autocast(_device_type(), enabled=False):
        yield
