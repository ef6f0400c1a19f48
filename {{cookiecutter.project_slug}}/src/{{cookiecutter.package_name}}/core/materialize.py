"""A model built on the meta device, given its values: each parameter by the slices this
process holds, read from a source (a seeded initialization, pretrained files).

The strategies call this after they lay the model out: a parameter split over devices is
asked for its local slices only, so no process ever holds the whole model. A parameter
tied to others (several names, one tensor) is filled once, under its first name, and every
name points at the result. Buffers are built on the host with the model (they are small:
masks, rotary tables) and move to the device whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

import torch
from torch import nn

Index = tuple[slice, ...]


class Source(Protocol):
    """Where a model's values come from."""

    def read(self, name: str, index: Index, dtype: torch.dtype) -> torch.Tensor:
        """The values of tensor `name` (the model's name) at `index` (a slice per
        dimension, in the whole tensor's coordinates), as a CPU tensor of `dtype`."""
        ...


def on_meta(model: nn.Module) -> bool:
    """True when the model's parameters have no storage yet (built on the meta device)."""
    return any(param.is_meta for param in model.parameters())


def whole(shape: torch.Size | tuple[int, ...]) -> Index:
    return tuple(slice(0, size) for size in shape)


def parameter_groups(model: nn.Module) -> Iterator[tuple[list[str], nn.Parameter]]:
    """Each distinct parameter once, with all its names (the first is where it is
    filled from), in the model's order."""
    names: dict[int, list[str]] = {}
    params: dict[int, nn.Parameter] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
        params.setdefault(id(param), param)
    for key, param in params.items():
        yield names[key], param


def replace_parameter(model: nn.Module, names: list[str], value: torch.Tensor,
                      like: nn.Parameter) -> nn.Parameter:  # fmt: skip
    """Put one new parameter holding `value` under every name of a tied group."""
    param = nn.Parameter(value, requires_grad=like.requires_grad)
    for name in names:
        owner, _, leaf = name.rpartition(".")
        model.get_submodule(owner)._parameters[leaf] = param
    return param


def fill_parameters(model: nn.Module, place: Callable[[str, nn.Parameter], torch.Tensor]) -> None:
    """Give every meta parameter its values: `place(name, meta_param)` returns the device
    tensor (reading from a source what this process holds)."""
    for names, param in list(parameter_groups(model)):
        if param.is_meta:
            replace_parameter(model, names, place(names[0], param), param)


def fill_whole(model: nn.Module, source: Source, device: torch.device | str) -> None:
    """Every parameter whole on `device` (one device, or a replica per process), then the
    buffers: one tensor on the host at a time."""

    def place(name: str, param: nn.Parameter) -> torch.Tensor:
        return source.read(name, whole(param.shape), param.dtype).to(device)

    fill_parameters(model, place)
    buffers_to(model, device)


def buffers_to(model: nn.Module, device: torch.device | str) -> None:
    """Move every buffer to `device` (the parameters are placed already)."""
    for module in model.modules():
        for key, buffer in module._buffers.items():
            if buffer is not None and buffer.device != torch.device(device):
                module._buffers[key] = buffer.to(device)


class Unfilled:
    """Memory without values, for a model a checkpoint is read into next (resuming,
    evaluating): nothing computed or read twice."""

    def read(self, name: str, index: Index, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty([part.stop - part.start for part in index], dtype=dtype)
