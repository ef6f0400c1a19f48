"""What an accelerator type (`v4-32`, `v5p-16`, ...) is: its hosts and devices, its chips'
peak, the type this machine is, and where a run's compilation cache goes."""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import tpu_generations


class RuntimeConfigError(ValueError):
    """Raised for a device/strategy request that cannot run here; the message says what to do."""


@dataclass(frozen=True)
class Topology:
    """Hosts and devices per host of a TPU accelerator type such as `v4-32`."""

    hosts: int
    devices_per_host: int

    @property
    def devices(self) -> int:
        return self.hosts * self.devices_per_host


def _slice(accelerator_type: str) -> tuple[tpu_generations.Generation, int]:
    try:
        return tpu_generations.parse(accelerator_type)
    except tpu_generations.UnknownAcceleratorType as error:
        raise RuntimeConfigError(str(error)) from None


def topology(accelerator_type: str) -> Topology:
    """Return the host/device layout of an accelerator type (`v3-8`, `v5p-16`, ...)."""
    generation, size = _slice(accelerator_type)
    return Topology(generation.hosts(size), generation.devices_per_host(size))


def devices_per_host(accelerator_type: str) -> int:
    """Devices on each host of the slice (8 on v3-8, 4 on v4-8 and v5p-16)."""
    return topology(accelerator_type).devices_per_host


def peak_bf16_flops_per_chip(accelerator_type: str) -> float:
    """Peak bf16 FLOP/s of one chip of the slice's generation (for MFU)."""
    return _slice(accelerator_type)[0].peak_bf16_flops_per_chip


def devices_per_chip(accelerator_type: str) -> int:
    """Devices one chip shows (2 on v2/v3, whose TensorCores are separate devices)."""
    return _slice(accelerator_type)[0].devices_per_chip


# What this project was made for; TPU_ACCELERATOR_TYPE (set on TPU VMs) wins, and the
# runtime may ask the VM's metadata too.
BAKED_ACCELERATOR_TYPE = "{{ cookiecutter.accelerator_type }}"


def accelerator_type() -> str:
    """This TPU's accelerator type: TPU_ACCELERATOR_TYPE, else the baked one."""
    return os.environ.get("TPU_ACCELERATOR_TYPE") or BAKED_ACCELERATOR_TYPE


# Where `compile_cache = "auto"` keeps compiled graphs on a TPU VM, shared by every run on
# the host: the folder the startup script makes, else one in the user's home.
SHARED_CACHE_DIRS = (
    "/var/cache/{{ cookiecutter.project_slug }}/xla",
    "~/.cache/{{ cookiecutter.project_slug }}/xla",
)


def compile_cache_dir(
    setting: str, accelerator: str, candidates: tuple[str, ...] = SHARED_CACHE_DIRS
) -> str | None:
    """The persistent compilation cache of a run: a path, or None for none.

    `auto` is on for TPU (the first writable shared folder) and off on the CPU, which
    cannot reuse compiled graphs from disk; `off` or empty turns it off; anything else
    is the folder to use.
    """
    if setting in ("", "off"):
        return None
    if setting != "auto":
        return setting
    if accelerator != "tpu":
        return None
    for candidate in candidates:
        folder = os.path.expanduser(candidate)
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError:
            continue
        if os.access(folder, os.W_OK):
            return folder
    return None
