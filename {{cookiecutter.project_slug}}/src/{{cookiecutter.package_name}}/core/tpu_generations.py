"""The TPU generations this project knows, from one table: `tpu_generations.json`.

Per generation: chips per host, devices per chip, the slice sizes Cloud TPU offers,
runtime versions and zones (the first of each is the default), the peak bf16
FLOPs and the HBM of one chip, the RAM of a host (a TPU VM) by its chips, whether Cloud TPU
joins several of its slices into one job over the data-center network (multislice), and the
training backends that run it. `docs/tpu-generations.md` shows the same table with its
sources.
An accelerator type is GENERATION-SIZE; the size counts TensorCores, which is the
chip count on generations with one TensorCore per chip (v5e, v6e).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

TABLE = "tpu_generations.json"
# The training backend this project was made for: a generation it cannot run is refused.
BACKEND = "{{ cookiecutter.backend }}"
_SIZE = re.compile(r"[1-9][0-9]*")


class UnknownAcceleratorType(ValueError):
    """An accelerator type that names no generation, or a slice size it does not offer."""


@dataclass(frozen=True)
class Generation:
    """One TPU generation, as the accelerator types name it (`v5litepod`, `v4`, ...)."""

    key: str
    name: str
    tensorcores_per_chip: int
    devices_per_chip: int
    chips_per_host: int
    single_host_chips: int
    slice_sizes: tuple[int, ...]
    runtime_versions: tuple[str, ...]
    zones: tuple[str, ...]
    peak_bf16_tflops_per_chip: float
    hbm_gib_per_chip: float
    multislice: bool
    source: str
    backends: tuple[str, ...] = ("torch_xla",)
    # A TPU VM's RAM in GB (10^9 bytes, the smaller reading of the docs' "GB") by the chips
    # it has; empty where Google's pages give none (`host_ram_note` says so).
    host_ram_gb_per_vm: tuple[tuple[int, float], ...] = ()
    host_ram_source: str = ""
    host_ram_note: str = ""

    @classmethod
    def from_entry(cls, key: str, entry: dict[str, Any]) -> Generation:
        return cls(
            key=key,
            name=entry["name"],
            tensorcores_per_chip=int(entry["tensorcores_per_chip"]),
            devices_per_chip=int(entry["devices_per_chip"]),
            chips_per_host=int(entry["chips_per_host"]),
            single_host_chips=int(entry["single_host_chips"]),
            slice_sizes=tuple(int(size) for size in entry["slice_sizes"]),
            runtime_versions=tuple(entry["runtime_versions"]),
            zones=tuple(entry["zones"]),
            peak_bf16_tflops_per_chip=float(entry["peak_bf16_tflops_per_chip"]),
            hbm_gib_per_chip=float(entry["hbm_gib_per_chip"]),
            multislice=bool(entry["multislice"]),
            source=entry["source"],
            backends=tuple(entry.get("backends", ("torch_xla",))),
            host_ram_gb_per_vm=tuple(
                (int(chips), float(gb)) for chips, gb in entry.get("host_ram_gb_per_vm", {}).items()
            ),
            host_ram_source=entry.get("host_ram_source", ""),
            host_ram_note=entry.get("host_ram_note", ""),
        )

    @property
    def peak_bf16_flops_per_chip(self) -> float:
        return self.peak_bf16_tflops_per_chip * 1e12

    @property
    def hbm_bytes_per_device(self) -> int:
        """HBM one XLA device holds: the chip's, shared by its devices on v2 and v3."""
        return int(self.hbm_gib_per_chip * 2**30) // self.devices_per_chip

    def chips(self, size: int) -> int:
        """Chips in a slice of this size (the size counts TensorCores)."""
        return size // self.tensorcores_per_chip

    def hosts(self, size: int) -> int:
        """Hosts (TPU VM workers) of a slice: one up to `single_host_chips` chips."""
        chips = self.chips(size)
        return 1 if chips <= self.single_host_chips else chips // self.chips_per_host

    def devices(self, size: int) -> int:
        """XLA devices of the whole slice: chips x devices per chip."""
        return self.chips(size) * self.devices_per_chip

    def chips_on_a_host(self, size: int) -> int:
        """Chips on each host (TPU VM) of a slice of this size."""
        return self.chips(size) // self.hosts(size)

    def devices_per_host(self, size: int) -> int:
        """XLA devices on each host: chips per host x devices per chip."""
        return self.chips_on_a_host(size) * self.devices_per_chip

    def host_ram_bytes(self, size: int) -> int | None:
        """RAM of each host of a slice of this size (its VM's, by its chips); None: unknown."""
        gb = dict(self.host_ram_gb_per_vm).get(self.chips_on_a_host(size))
        return None if gb is None else int(gb * 10**9)


@cache
def generations() -> dict[str, Generation]:
    """Every generation of the table, by the name accelerator types use."""
    text = resources.files(__package__).joinpath(TABLE).read_text(encoding="utf-8")
    return {key: Generation.from_entry(key, entry) for key, entry in json.loads(text).items()}


def _listed(sizes: tuple[int, ...], most: int = 8) -> str:
    if len(sizes) <= most:
        return ", ".join(map(str, sizes))
    return f"{', '.join(map(str, sizes[: most - 1]))}, ... {sizes[-1]}"


# Names people use for a generation besides the one in accelerator types.
ALIASES = {"v5e": "v5litepod"}


def canonical(accelerator_type: str) -> str:
    """`v5e-8` as Cloud TPU names it, `v5litepod-8`; other types unchanged."""
    key, sep, size = accelerator_type.strip().partition("-")
    return f"{ALIASES.get(key, key)}{sep}{size}"


def parse(accelerator_type: str) -> tuple[Generation, int]:
    """Split `v5p-16` into its generation and slice size; refuse sizes it does not offer."""
    key, _, size = accelerator_type.partition("-")
    known = generations()
    if key not in known:
        raise UnknownAcceleratorType(
            f"unknown accelerator type {accelerator_type!r}: use GENERATION-SIZE with a "
            f"generation among {', '.join(known)} (v5e is v5litepod), e.g. v4-8 or v5p-16"
        )
    generation = known[key]
    if BACKEND not in generation.backends:
        raise UnknownAcceleratorType(
            f"{generation.name} ({accelerator_type}) does not run on {BACKEND}, the backend "
            f"this project is built on (it runs on {', '.join(generation.backends)}): choose "
            "another generation, or bake the project with that backend"
        )
    if not _SIZE.fullmatch(size) or int(size) not in generation.slice_sizes:
        raise UnknownAcceleratorType(
            f"accelerator type {accelerator_type!r} is not a {key} slice: "
            f"{key} sizes are {_listed(generation.slice_sizes)}"
        )
    return generation, int(size)
