"""Accelerator detection and the process topology of a TorchTPU job (one process per device).

TorchTPU (`torch_tpu`) is native PyTorch: the device is `torch.device("tpu")`, processes
meet in a `torch.distributed` process group (`"tpu"` on a TPU, `"gloo"` on the CPU
stand-in) that `torchrun` sets up, one process per device on every host. Off a TPU the same
code runs on `"cpu"` with `gloo`: several real processes, a real rendezvous. Nothing here
starts a device or a process group at import time.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any

from . import host_exchange

# How many slices the job spans and which one this worker is on (1 and 0 on one slice), as
# the pod launcher set them: `core.multislice` says what they read.
from .multislice import slice_count as slice_count
from .multislice import slice_index as slice_index

# The accelerator types' facts (`core.topology`), asked of the runtime as of the other backend.
from .topology import BAKED_ACCELERATOR_TYPE as BAKED_ACCELERATOR_TYPE
from .topology import SHARED_CACHE_DIRS as SHARED_CACHE_DIRS
from .topology import RuntimeConfigError as RuntimeConfigError
from .topology import Topology as Topology
from .topology import accelerator_type as accelerator_type
from .topology import compile_cache_dir as compile_cache_dir
from .topology import devices_per_chip as devices_per_chip
from .topology import devices_per_host as devices_per_host
from .topology import peak_bf16_flops_per_chip as peak_bf16_flops_per_chip
from .topology import topology as topology

ACCELERATORS = ("auto", "tpu", "cpu")
# The accelerator a run resolved to, for the processes torchrun starts from it.
ACCELERATOR_VARIABLE = "TORCH_TPU_PROJECT_ACCELERATOR"


# Settings of torch_xla's this backend has no counterpart for (docs/torch-tpu.md lists them
# with the rest it does not offer): each is refused in one line, with what to do instead.
UNOFFERED_SETTINGS = {
    "compile_cache": "TorchTPU keeps its compiled programs itself and this backend sets no "
    "cache of its own: leave compile_cache unset",
    "profile_port": "`profile` records with torch.profiler in the training process and opens "
    "no profiler server: leave profile_port unset",
}


def check_settings(changed: dict[str, Any]) -> None:
    """Refuse the run settings (those set away from their defaults) this backend does not
    offer."""
    for key, why in UNOFFERED_SETTINGS.items():
        if key in changed:
            raise RuntimeConfigError(f"{key} = {changed[key]!r} is torch_xla's: {why}")


def mesh_slice_count() -> int:
    """The slices the device mesh spans: one (this backend lays no mesh over slices)."""
    return 1


def tpu_present() -> bool:
    """True when this host has TPU device files and TorchTPU is installed (nothing started)."""
    return host_exchange.has_tpu_devices() and importlib.util.find_spec("torch_tpu") is not None


def detect_accelerator(requested: str = "auto") -> str:
    """Resolve `auto`/`tpu`/`cpu` to the accelerator this process will use."""
    if requested not in ACCELERATORS:
        raise RuntimeConfigError(
            f"unknown accelerator {requested!r}: choose one of {', '.join(ACCELERATORS)}"
        )
    if requested == "auto":
        return os.environ.get(ACCELERATOR_VARIABLE) or ("tpu" if tpu_present() else "cpu")
    if requested == "tpu" and not tpu_present():
        raise RuntimeConfigError(
            "accelerator 'tpu' requested but no TPU was found on this host (no /dev/accel* "
            "or /dev/vfio device, or torch_tpu not installed): run on a TPU VM with the "
            "`tpu` extra, or use --accelerator cpu"
        )
    return requested


_notified = False


def configure(accelerator: str = "auto", cpu_devices: int = 1, tpu_core: int | None = None) -> str:
    """Record the accelerator for this process and those it starts; return it resolved."""
    global _notified
    resolved = detect_accelerator(accelerator)
    os.environ[ACCELERATOR_VARIABLE] = resolved
    if resolved == "cpu" and accelerator == "auto" and not _notified:
        print("note: no TPU found on this host; running on the CPU", file=sys.stderr)
        _notified = True
    if resolved == "tpu" and tpu_core is not None:
        os.environ["TPU_VISIBLE_CHIPS"] = str(tpu_core)
    return resolved


def accelerator() -> str:
    """The accelerator `configure` chose ("tpu" or "cpu")."""
    return os.environ.get(ACCELERATOR_VARIABLE) or detect_accelerator("auto")


def runtime_initialized() -> bool:
    """True once this process has joined its process group."""
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized())


def device() -> Any:
    """This process's device: its TPU chip (`tpu:0` in every process), or the CPU."""
    import torch

    return torch.device("tpu" if accelerator() == "tpu" else "cpu")


def launched() -> bool:
    """True in a process that torchrun started (its rank and world are in the environment)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


@dataclass(frozen=True)
class Hosts:
    """The hosts of a job and this one's place: what torchrun's rendezvous needs."""

    count: int
    rank: int
    coordinator: str
    port: int


DEFAULT_PORT = 29500  # torchrun's


def hosts() -> Hosts:
    """This job's hosts: torchrun's NNODES, NODE_RANK, MASTER_ADDR and MASTER_PORT (what
    TorchTPU's launcher helper sets on a TPU VM), else the slice's TPU_WORKER_HOSTNAMES and
    this worker's TPU_WORKER_ID (what the helper reads them from); one host without them."""
    port = _env_int("MASTER_PORT", DEFAULT_PORT)
    if "NNODES" in os.environ and "MASTER_ADDR" in os.environ:
        return Hosts(
            _env_int("NNODES", 1), _env_int("NODE_RANK", 0), os.environ["MASTER_ADDR"], port
        )
    names = [n.strip() for n in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if n.strip()]
    if len(names) > 1:
        rank = _env_int("TPU_WORKER_ID", 0)
        if rank >= len(names):
            raise RuntimeConfigError(
                f"TPU_WORKER_ID={rank} is not below the {len(names)} TPU_WORKER_HOSTNAMES: "
                "the launcher set them apart"
            )
        return Hosts(len(names), rank, names[0], port)
    return Hosts(1, 0, "localhost", port)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else default


def init_process_group() -> None:
    """Join the job's process group: torchrun's rendezvous, or a world of one process."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "tpu" if accelerator() == "tpu" else "gloo"
    with host_exchange.stdout_silenced():
        if launched() and _env_int("WORLD_SIZE", 1) > 1:
            dist.init_process_group(backend)
        else:
            # No rendezvous port: two runs on one machine must not meet (or collide).
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def leave_process_group() -> None:
    """Leave the job's process group once every process is done with it: none tears its
    connections down while another still uses them (a process exiting under another's
    collective, or its store, can abort it)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if dist.get_world_size() > 1:
        dist.barrier()
    dist.destroy_process_group()


def world_size() -> int:
    """Processes taking part in collectives (one per device)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return int(dist.get_world_size())
    return _env_int("WORLD_SIZE", 1)


def global_ordinal() -> int:
    import torch.distributed as dist

    if dist.is_initialized():
        return int(dist.get_rank())
    return _env_int("RANK", 0)


def local_ordinal() -> int:
    return _env_int("LOCAL_RANK", 0)


def process_index() -> int:
    """This process's index in the job (each process holds its own generators and data)."""
    return global_ordinal()


def process_count() -> int:
    return world_size()


def addressable_device_count() -> int:
    """Devices this process addresses: one."""
    return 1


def global_device_count() -> int:
    return world_size()


_host_group: Any = None


def host_group() -> Any:
    """A gloo group over the job's processes, for host-side values (one per job)."""
    global _host_group
    import torch.distributed as dist

    init_process_group()
    if _host_group is None:
        gloo = dist.get_backend() == "gloo"
        _host_group = dist.group.WORLD if gloo else dist.new_group(backend="gloo")
    return _host_group


def host_all_reduce_max(value: int) -> int:
    """The largest of every process's `value` (a host-to-host exchange, no device work)."""
    return host_exchange.all_reduce_max(value, host_group())


def host_barrier() -> None:
    """Wait for every process of the job (host side)."""
    host_exchange.barrier(host_group())


# The processes that read different data (a tensor-parallel group reads one batch), as the
# strategy set them: the step's loss is averaged over them, the global batch's loss.
_data_group: tuple[Any, int] = (None, 1)


def set_data_group(group: Any, size: int) -> None:
    global _data_group
    _data_group = (group, size)


def mean_over_data(tensors: list[Any]) -> list[Any]:
    """Each scalar averaged over the data-parallel processes (one all-reduce, no host read)."""
    group, size = _data_group
    if size == 1 or not tensors:
        return tensors
    import torch
    import torch.distributed as dist

    stacked = torch.stack([t.detach().float().reshape(()) for t in tensors])
    dist.all_reduce(stacked, group=group)
    return list((stacked / size).unbind())
