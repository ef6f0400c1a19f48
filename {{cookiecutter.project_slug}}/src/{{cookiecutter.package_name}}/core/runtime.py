"""Accelerator detection and the process/replica topology of the XLA runtime.

Nothing here initialises the XLA runtime at import time: `torch_xla` is imported
inside functions, after `configure()` has set the environment it reads once.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from . import host_exchange

# How many slices the job spans and which one this worker is on (1 and 0 on one slice), as
# the pod launcher set them for the TPU runtime: `core.multislice` says what they read.
from .multislice import slice_count as slice_count
from .multislice import slice_index as slice_index

# The accelerator types' facts (`core.topology`), asked of the runtime by the whole project.
from .topology import BAKED_ACCELERATOR_TYPE as BAKED_ACCELERATOR_TYPE
from .topology import SHARED_CACHE_DIRS as SHARED_CACHE_DIRS
from .topology import RuntimeConfigError as RuntimeConfigError
from .topology import Topology as Topology
from .topology import compile_cache_dir as compile_cache_dir
from .topology import devices_per_chip as devices_per_chip
from .topology import devices_per_host as devices_per_host
from .topology import peak_bf16_flops_per_chip as peak_bf16_flops_per_chip
from .topology import topology as topology

ACCELERATORS = ("auto", "tpu", "cpu")


def check_settings(changed: dict[str, Any]) -> None:
    """Refuse the run settings (those set away from their defaults) this backend does not
    offer: torch_xla offers every one."""


def mesh_slice_count() -> int:
    """The slices the device mesh spans: slice_count() on TPU. On XLA:CPU each process is a
    world of its own (a pod rehearsal's workers), so a launcher's slice variables make no mesh."""
    return slice_count() if os.environ.get("PJRT_DEVICE", "").upper() == "TPU" else 1


def accelerator_type() -> str:
    """This TPU's accelerator type: TPU_ACCELERATOR_TYPE, the VM's metadata, else the baked one."""
    named = os.environ.get("TPU_ACCELERATOR_TYPE")
    if named:
        return named
    try:
        from torch_xla._internal import tpu

        return str(tpu.get_tpu_env()["ACCELERATOR_TYPE"])
    except Exception:  # no metadata server (not a TPU VM): several exception types
        return BAKED_ACCELERATOR_TYPE


def tpu_present() -> bool:
    """Return True when this host has TPU device files and libtpu (no metadata-server call)."""
    has_libtpu = importlib.util.find_spec("libtpu") is not None or "TPU_LIBRARY_PATH" in os.environ
    return host_exchange.has_tpu_devices() and has_libtpu


def detect_accelerator(requested: str = "auto") -> str:
    """Resolve `auto`/`tpu`/`cpu` to the accelerator this process will use."""
    if requested not in ACCELERATORS:
        raise RuntimeConfigError(
            f"unknown accelerator {requested!r}: choose one of {', '.join(ACCELERATORS)}"
        )
    pjrt = os.environ.get("PJRT_DEVICE", "").upper()
    if requested == "auto":
        if pjrt in ("TPU", "CPU"):
            return pjrt.lower()
        return "tpu" if tpu_present() else "cpu"
    if requested == "tpu" and not tpu_present() and pjrt != "TPU":
        raise RuntimeConfigError(
            "accelerator 'tpu' requested but no TPU was found on this host "
            "(no /dev/accel* or /dev/vfio device, or libtpu not installed): "
            "run on a TPU VM with the `tpu` extra, or use --accelerator cpu"
        )
    return requested


_notified = False

# XLA:CPU's default (concurrency-optimized) schedule starts every all-gather of a step before
# its first layer: an fsdp step then holds each device's whole gathered model at once, all of
# it in this host's RAM. The sequential schedule gathers a layer when it runs, as `plan` counts.
CPU_SCHEDULE_FLAG = "xla_cpu_enable_concurrency_optimized_scheduler"


def configure(accelerator: str = "auto", cpu_devices: int = 1, tpu_core: int | None = None) -> str:
    """Set the PJRT environment before the runtime starts; return the resolved accelerator."""
    global _notified
    resolved = detect_accelerator(accelerator)
    os.environ["PJRT_DEVICE"] = resolved.upper()
    if resolved == "cpu":
        os.environ["CPU_NUM_DEVICES"] = str(cpu_devices)
        flags = os.environ.get("XLA_FLAGS", "")
        if CPU_SCHEDULE_FLAG not in flags:  # a value of the user's own stands
            os.environ["XLA_FLAGS"] = f"{flags} --{CPU_SCHEDULE_FLAG}=false".strip()
        if accelerator == "auto" and not _notified:
            print("note: no TPU found on this host; running on XLA:CPU", file=sys.stderr)
            _notified = True
    elif tpu_core is not None:
        # One chip in one process: the PJRT way of the old `tpu_cores=[5]`.
        os.environ["TPU_VISIBLE_CHIPS"] = str(tpu_core)
        os.environ["TPU_PROCESS_BOUNDS"] = "1,1,1"
        os.environ["TPU_CHIPS_PER_PROCESS_BOUNDS"] = "1,1,1"
    return resolved


def runtime_initialized() -> bool:
    """Return True if the XLA runtime has already started in this process."""
    if "torch_xla" not in sys.modules:
        return False
    import torch_xla

    return bool(torch_xla._XLAC._xla_runtime_is_initialized())


def device() -> Any:
    """Return this process's XLA device."""
    import torch_xla

    return torch_xla.device()


def world_size() -> int:
    """Number of replicas taking part in collectives (1 under SPMD)."""
    import torch_xla.runtime as xr

    return int(xr.world_size())


def global_ordinal() -> int:
    import torch_xla.runtime as xr

    return int(xr.global_ordinal())


def local_ordinal() -> int:
    import torch_xla.runtime as xr

    return int(xr.local_ordinal())


def process_index() -> int:
    """Index of this host process (0 on a single VM)."""
    import torch_xla.runtime as xr

    return int(xr.process_index())


def process_count() -> int:
    import torch_xla.runtime as xr

    return int(xr.process_count())


def addressable_device_count() -> int:
    """Devices this process can address (all local devices under SPMD)."""
    import torch_xla.runtime as xr

    return int(xr.addressable_runtime_device_count())


def global_device_count() -> int:
    import torch_xla.runtime as xr

    return int(xr.global_runtime_device_count())


def host_group() -> Any:
    """A gloo process group over the job's processes, for host-side values (one per job)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        import torch_xla.distributed.xla_backend  # noqa: F401  (registers the xla:// rendezvous)
        import torch_xla.runtime as xr

        processes = xr.process_count() if xr.is_spmd() else xr.world_size()
        with host_exchange.stdout_silenced():
            if processes == 1:
                # No rendezvous port: two runs on one machine must not meet (or collide).
                dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            else:
                dist.init_process_group("gloo", init_method="xla://")
    return dist.group.WORLD


def host_all_reduce_max(value: int) -> int:
    """The largest of every process's `value` (a host-to-host exchange, no device work)."""
    return host_exchange.all_reduce_max(value, host_group())


def host_barrier() -> None:
    """Wait for every process of the job (host side)."""
    host_exchange.barrier(host_group())
