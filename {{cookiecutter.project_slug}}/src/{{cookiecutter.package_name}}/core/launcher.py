"""Turn accelerator/devices/strategy requests into a run plan, and launch it."""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import multislice, runtime, strategies
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
    multislice.check_slices("", runtime.slice_count())  # the launcher's slices, if any
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
    give_back_freed_memory()
    return plan.strategy.launch(fn, args, start_method)


# glibc's malloc serves a block under its mmap threshold from its heaps, one per thread
# that allocates, and raises the threshold (up to 32 MiB) each time a larger block is freed.
# The blocks a run allocates and frees again and again (a loaded slice, FSDP's gathered
# layers and unreduced gradients, host buffers on their way to a device) then stay in the
# heaps of the threads that freed them. A 415M model's fine-tuning on 4 CPU processes
# (torch_tpu, fsdp) peaked 2.3 to 2.9 GiB per process above a tiny model's run; with the
# threshold fixed at glibc's own starting value (every block above it goes back to the
# system when freed) and the embedding and head FSDP units of their own, 1.3 GiB.
MMAP_THRESHOLD = 128 * 1024
M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)


def give_back_freed_memory() -> None:
    """Fix glibc's mmap threshold in this process and the processes it starts (their
    `MALLOC_MMAP_THRESHOLD_`, unless set); nothing where the C library is not glibc."""
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(MMAP_THRESHOLD))
    with contextlib.suppress(OSError, AttributeError, ValueError):
        threshold = int(os.environ["MALLOC_MMAP_THRESHOLD_"])
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, threshold)
