"""Turn accelerator/devices/strategy requests into a run plan, and launch it."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import runtime, strategies
from .runtime import RuntimeConfigError
from .strategies import CPU_EMULATED_DEVICES, Strategy


@dataclass(frozen=True)
class Plan:
    """What will run: the accelerator, the strategy object and the local devices it uses."""

    accelerator: str  # "tpu" or "cpu"
    strategy: Strategy
    devices: int | None  # local devices; None means every local device
    core: int | None = None  # one specific TPU chip/core, the old `tpu_cores=[5]`


def parse_devices(devices: str | int) -> tuple[int | None, int | None]:
    """Parse `1`, `8`, `all` or `[5]` into (count or None for all, core id or None)."""
    text = str(devices).strip()
    if text == "all":
        return None, None
    if text.startswith("[") and text.endswith("]") and text[1:-1].strip().isdigit():
        return 1, int(text[1:-1])
    if text.isdigit() and int(text) > 0:
        return int(text), None
    raise RuntimeConfigError(
        f"invalid devices {devices!r}: "
        "use a positive count (1, 8), 'all', or one core id like '[5]'"
    )


def make_plan(
    accelerator: str = "auto", devices: str | int = 1, strategy: str = "auto", mesh: str = ""
) -> Plan:
    """Validate a request and decide how it runs; raise RuntimeConfigError with the fix."""
    resolved = runtime.detect_accelerator(accelerator)
    count, core = parse_devices(devices)
    if resolved == "cpu":
        if core is not None:
            raise RuntimeConfigError(
                "selecting one core id needs a TPU; on the CPU use --devices 1"
            )
        if count is None:
            count = int(os.environ.get("CPU_NUM_DEVICES", CPU_EMULATED_DEVICES))
    chosen = strategies.resolve(strategy, resolved, count, core, mesh)
    return Plan(accelerator=resolved, strategy=chosen, devices=count, core=core)


def launch(
    fn: Callable[..., Any], plan: Plan, args: tuple[Any, ...] = (), start_method: str = "spawn"
) -> Any:
    """Run `fn(*args)` as the plan's strategy runs: in-process, one process per device, SPMD."""
    return plan.strategy.launch(fn, args, start_method)
