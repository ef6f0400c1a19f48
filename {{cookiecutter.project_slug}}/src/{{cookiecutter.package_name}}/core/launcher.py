"""Turn accelerator/devices/strategy requests into a run plan, and launch it."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import runtime
from .runtime import RuntimeConfigError

# XLA:CPU emulates this many devices when `--devices all` is asked for off-TPU.
CPU_EMULATED_DEVICES = 8


@dataclass(frozen=True)
class Plan:
    """What will run: the accelerator, the strategy and how many local devices it uses."""

    accelerator: str  # "tpu" or "cpu"
    strategy: str  # "single", "ddp" or "spmd"
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


def make_plan(accelerator: str = "auto", devices: str | int = 1, strategy: str = "auto") -> Plan:
    """Validate a request and decide how it runs; raise RuntimeConfigError with the fix."""
    if strategy not in runtime.STRATEGIES:
        raise RuntimeConfigError(
            f"unknown strategy {strategy!r}: choose one of {', '.join(runtime.STRATEGIES)}"
        )
    resolved = runtime.detect_accelerator(accelerator)
    count, core = parse_devices(devices)
    if resolved == "cpu":
        if core is not None:
            raise RuntimeConfigError(
                "selecting one core id needs a TPU; on XLA:CPU use --devices 1"
            )
        if count is None:
            count = int(os.environ.get("CPU_NUM_DEVICES", CPU_EMULATED_DEVICES))
    if strategy == "auto":
        many = "ddp" if resolved == "tpu" else "spmd"
        strategy = "single" if count == 1 else many
    if strategy == "single" and count != 1:
        raise RuntimeConfigError(
            f"strategy 'single' runs on one device but devices={devices!r}: "
            "use --devices 1, or --strategy ddp/spmd for more"
        )
    if resolved == "cpu" and strategy == "ddp" and count != 1:
        raise RuntimeConfigError(
            "XLA:CPU has no multi-process collectives, so strategy 'ddp' cannot use "
            f"{count} devices here: use --strategy spmd to emulate them in one process"
        )
    return Plan(accelerator=resolved, strategy=strategy, devices=count, core=core)


def _replica_entry(index: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    fn(*args)


def launch(
    fn: Callable[..., Any], plan: Plan, args: tuple[Any, ...] = (), start_method: str = "spawn"
) -> Any:
    """Run `fn(*args)` as the plan says: in-process, one process per device, or SPMD."""
    cpu_devices = (plan.devices or 1) if plan.strategy == "spmd" else 1
    runtime.configure(plan.accelerator, cpu_devices=cpu_devices, tpu_core=plan.core)
    # One ddp replica needs no spawn: run it here, where its result can be returned.
    if plan.strategy == "ddp" and plan.devices != 1:
        if runtime.runtime_initialized():
            raise RuntimeConfigError(
                "the XLA runtime is already initialized in this process, so it cannot "
                "spawn replicas: do not touch an XLA device before launching "
                "(in a notebook, restart the kernel)"
            )
        import torch_xla

        return torch_xla.launch(_replica_entry, args=(fn, args), start_method=start_method)
    if plan.strategy == "spmd":
        import torch_xla.runtime as xr

        xr.use_spmd()
        found = runtime.addressable_device_count()
        if plan.devices is not None and found != plan.devices:
            raise RuntimeConfigError(
                f"asked for {plan.devices} devices but this host has {found}: "
                "use --devices all or the host's device count"
            )
    return fn(*args)
