"""A model's initial values, computed one module at a time on the host by the model's own
initialization, without the model ever being whole.

A model built on the meta device (`meta.py`) has no values; this source gives them where
the strategy places each parameter. Every module is initialized as the model would
initialize it: a Hugging Face model's `_init_weights(module)` (after the module's own
`reset_parameters`, as transformers builds it), a peft LoRA layer's `reset_lora_parameters`,
any other module's `reset_parameters`. Each module draws from torch's CPU generator seeded
by the run's seed and the module's name, so a module's values depend on nothing else: not
on the mesh, the process count, the backend or the order modules are asked in. They are not
the numbers a model built whole draws (there every module draws in turn from one stream):
the same distributions, other samples. A tied parameter is initialized by the module it
belongs to first (the embedding, not the head that reuses it).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from ..core.materialize import Index


class NotInitializable(ValueError):
    """A module whose parameters its initialization leaves unset (the model must be built
    whole, as its constructor sets them)."""


@dataclass
class Unit:
    """One call that initializes some parameters: a module and what it sets."""

    name: str  # the module's name (seeds its generator)
    call: Callable[[], None]
    params: list[str] = field(default_factory=list)  # the parameters it owns (first names)


def unit_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % 2**63


def _hf_root(model: nn.Module, name: str) -> nn.Module | None:
    """The innermost Hugging Face model holding module `name` (None: not in one)."""
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return None
    found = model if isinstance(model, PreTrainedModel) else None
    path = ""
    for part in name.split(".") if name else []:
        path = f"{path}.{part}" if path else part
        module = model.get_submodule(path)
        if isinstance(module, PreTrainedModel) and path != name:
            found = module
    return found


def _is_lora_layer(module: nn.Module) -> bool:
    return hasattr(module, "reset_lora_parameters") and hasattr(module, "lora_A")


def _initializer(model: nn.Module, name: str, module: nn.Module) -> Callable[[], None] | None:
    """How module `name` sets its own parameters (None: it has no way)."""
    if _is_lora_layer(module):

        def lora_init() -> None:  # peft's default: A as a Linear's weight, B zeros
            for adapter in module.lora_A:  # type: ignore[union-attr]
                module.reset_lora_parameters(adapter, True)  # type: ignore[operator]

        return lora_init
    reset = getattr(type(module), "reset_parameters", None)
    root = _hf_root(model, name)
    if root is not None:

        def hf_init() -> None:
            if reset is not None:
                reset(module)
            root._init_weights(module)  # type: ignore[operator]

        return hf_init
    if reset is not None:
        return lambda: reset(module)
    return None


def units(model: nn.Module) -> dict[str, Unit]:
    """Every parameter's initializing unit, by the parameter's first name. A LoRA layer's
    unit sets its adapters (in its `lora_*` children); others set their own parameters."""
    first: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        first.setdefault(id(param), name)
    owners: dict[str, Unit] = {}
    lora_prefixes: list[str] = []
    for module_name, module in model.named_modules():
        if _is_lora_layer(module):
            lora_prefixes.append(f"{module_name}.lora_" if module_name else "lora_")
    for module_name, module in model.named_modules(remove_duplicate=False):
        for leaf, param in module.named_parameters(recurse=False):
            name = f"{module_name}.{leaf}" if module_name else leaf
            if first.get(id(param)) != name:
                continue  # a tied parameter: its first owner sets it
            lora = next((p for p in lora_prefixes if name.startswith(p)), None)
            unit_name = lora.rsplit(".lora_", 1)[0] if lora is not None else module_name
            unit_module = model.get_submodule(unit_name) if unit_name else model
            unit = owners.get(unit_name)
            if unit is None:
                call = _initializer(model, unit_name, unit_module)
                if call is None:
                    raise NotInitializable(
                        f"module {unit_name or 'the model'!r} ({type(unit_module).__name__}) "
                        "has parameters but no reset_parameters to set them"
                    )
                unit = owners[unit_name] = Unit(unit_name, call)
            unit.params.append(name)
    return {param: unit for unit in owners.values() for param in unit.params}


class SeededInit:
    """The values of a meta-device model's parameters as its own initialization gives
    them, computed a unit (module) at a time: the last unit's tensors are kept until a
    parameter of another unit is asked for."""

    def __init__(self, model: nn.Module, seed: int) -> None:
        self.model = model
        self.seed = seed
        self.units = units(model)  # NotInitializable: the model cannot be built this way
        self._cached: tuple[str, dict[str, torch.Tensor]] | None = None

    def names(self) -> set[str]:
        return set(self.units)

    def read(self, name: str, index: Index, dtype: torch.dtype) -> torch.Tensor:
        unit = self.units[name]
        if self._cached is None or self._cached[0] != unit.name:
            self._cached = (unit.name, self._compute(unit))
        return self._cached[1][name][index].to(dtype)

    def _compute(self, unit: Unit) -> dict[str, torch.Tensor]:
        """Run the unit's initialization on host tensors standing in for its parameters, in
        float32 as a model built whole is before its precision casts it (NaN before it
        runs: whatever it leaves unset is found)."""
        slots = [self._slot(name) for name in unit.params]
        saved = [owner._parameters[leaf] for owner, leaf in slots]
        hosts = []
        for (owner, leaf), param in zip(slots, saved, strict=True):
            assert param is not None
            host = torch.full(tuple(param.shape), math.nan, dtype=torch.float32, device="cpu")
            owner._parameters[leaf] = nn.Parameter(host, requires_grad=param.requires_grad)
            hosts.append(host)
        try:
            with torch.no_grad(), _seeded(unit_seed(self.seed, unit.name)):
                unit.call()
        finally:
            for (owner, leaf), param in zip(slots, saved, strict=True):
                owner._parameters[leaf] = param
        values = {}
        for name, host in zip(unit.params, hosts, strict=True):
            if host.is_floating_point() and bool(torch.isnan(host).any()):
                raise NotInitializable(
                    f"parameter {name!r} is not set by its module's initialization "
                    f"({unit.name or 'the model'}): give the module a reset_parameters"
                )
            values[name] = host
        return values

    def _slot(self, name: str) -> tuple[nn.Module, str]:
        owner, _, leaf = name.rpartition(".")
        return (self.model.get_submodule(owner) if owner else self.model), leaf


class _seeded:
    """torch's CPU generator seeded for a block, restored after it."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._state: torch.Tensor | None = None

    def __enter__(self) -> None:
        self._state = torch.random.get_rng_state()
        torch.manual_seed(self.seed)

    def __exit__(self, *exc: object) -> None:
        assert self._state is not None
        torch.random.set_rng_state(self._state)
