"""Pretrained weights read shard by shard: any slice of any tensor of a Hugging Face checkpoint, by
the byte ranges that hold it, from a `save_pretrained` folder, the Hugging Face cache or gs://.

`open_pretrained(location, model)` reads the checkpoint's headers only and checks it against the
model (built on the meta device from the checkpoint's config) before any tensor is read: a
missing shard, a file cut short, a key the model lacks or lacks a value for, a shape or a dtype
the model cannot take is refused in one line. Then `read(name, index, dtype)` gives a slice of a
model tensor: a host holds the slices it asks for and nothing around them.

A tensor that a weight converter makes (a mixture of experts' `experts.N.w1 ... w3`, stacked
into one `experts.gate_up_proj`) is made by transformers' own operations from its source tensors
read whole: it costs one target tensor of host memory, and each process that needs a part of it
reads all of its sources, except a slice of the experts' dim of such a stack, which reads only
those experts' tensors.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch import nn

from .hf_names import Converted, Names, Renamed, Tied, convert, converted_shapes, map_names
from .locations import pretrained_config, pretrained_tokenizer, resolve
from .safetensors_io import FLOATS, Stored, read_checkpoint, read_slice, slice_bounds
from .storage import Folder, WeightsError

__all__ = ["PretrainedWeights", "WeightsError", "open_pretrained", "pretrained_config",
           "pretrained_tokenizer"]  # fmt: skip


class PretrainedWeights:
    """A checkpoint's values for one model, read by slice (`open_pretrained` makes it)."""

    def __init__(
        self, location: str, folder: Folder, stored: dict[str, Stored], names: Names,
        targets: dict[str, torch.Size], config: Any,
    ) -> None:  # fmt: skip
        self.location = location
        self.bytes_read = 0  # bytes of tensor data fetched so far (headers apart)
        self._folder = folder
        self._stored = stored
        self._sources = names.sources
        self._targets = targets
        self._config = config
        self._made: tuple[Converted, dict[str, torch.Tensor]] | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_made": None, "_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def names(self) -> set[str]:
        """The model parameter and persistent-buffer names this source gives values for."""
        return set(self._sources)

    def read(self, name: str, index: tuple[slice, ...], dtype: torch.dtype) -> torch.Tensor:
        """The CPU values of model tensor `name` at `index` (one slice per dimension, global
        coordinates, step 1), as `dtype`, reading only the byte ranges that hold them (a slice
        of dim 0 is one range; slices of later dims are one range per row of the leading dims,
        merged where adjacent)."""
        source = self._sources.get(name)
        if source is None:
            raise KeyError(f"{self.location} gives no value for {name}")
        if isinstance(source, Tied):
            return self.read(source.name, index, dtype)
        if isinstance(source, Renamed):
            values, fetched = read_slice(self._folder, self._stored[source.key], index)
            self._count(fetched)
            return values.to(dtype)
        return self._read_converted(name, source, index).to(dtype)

    def _read_converted(
        self, name: str, group: Converted, index: tuple[slice, ...]
    ) -> torch.Tensor:
        bounds = slice_bounds(name, index, tuple(self._targets[name]))
        if group.per_expert and bounds[0] != (0, self._targets[name][0]):
            # Only the experts in the slice: each source list holds one tensor per expert.
            first, stop = bounds[0]
            tensors = {pattern: [self._whole(key) for key in keys[first:stop]]
                       for pattern, keys in group.sources.items()}  # fmt: skip
            stack = convert(group, tensors, self._config)[name]
            return stack[(slice(None), *index[1:])].contiguous()
        last = self._made
        if last is None or last[0] is not group:
            self._made = last = None  # the last group's tensors go before the next one's come
            tensors = {pattern: [self._whole(key) for key in keys]
                       for pattern, keys in group.sources.items()}  # fmt: skip
            self._made = last = (group, convert(group, tensors, self._config))
        return last[1][name][index].clone()

    def _whole(self, key: str) -> torch.Tensor:
        stored = self._stored[key]
        values, fetched = read_slice(self._folder, stored, tuple(slice(None) for _ in stored.shape))
        self._count(fetched)
        return values

    def _count(self, fetched: int) -> None:
        with self._lock:
            self.bytes_read += fetched

    def close(self) -> None:
        """Close the files held open (a later read opens them again)."""
        self._made = None
        self._folder.close()


def open_pretrained(location: str, model: nn.Module) -> PretrainedWeights:
    """`location`: a local folder written by save_pretrained, a Hugging Face cache name (resolved
    offline, nothing downloaded: huggingface_hub's snapshot in the local cache), or
    gs://bucket/folder (any fsspec URL). `model`: the transformers model built on the META
    device from that checkpoint's config (its state_dict names and shapes are the targets).
    Checks everything up front and reads only the files' headers."""
    folder = Folder(resolve(location))
    stored = read_checkpoint(folder)
    state = model.state_dict()
    names = map_names(model, stored, state)
    config = getattr(model, "config", None)
    check(location, folder, stored, names, state, config)
    targets = {name: state[name].shape for name in names.sources}
    return PretrainedWeights(location, folder, stored, names, targets, config)


def check(
    location: str, folder: Folder, stored: dict[str, Stored], names: Names,
    targets: dict[str, torch.Tensor], config: Any,
) -> None:  # fmt: skip
    """Refuse, in one line, a checkpoint whose dtypes, names or shapes the model cannot take:
    each the first in the model's order."""
    for name in targets:
        for key in source_keys(names.sources.get(name)):
            refuse_dtype(folder, stored[key], name, targets[name].dtype)
    if names.missing or names.unexpected:
        refuse_names(location, stored, names, getattr(config, "model_type", None))
    made: dict[int, dict[str, tuple[int, ...]] | None] = {}  # each group's shapes, once
    for name, target in targets.items():
        source = names.sources.get(name)
        if isinstance(source, Renamed) and stored[source.key].shape != tuple(target.shape):
            what = f"{source.key} (in {stored[source.key].file})"
            refuse_shape(location, what, stored[source.key].shape, name, target.shape)
        if isinstance(source, Converted):
            if id(source) not in made:
                shapes = {k: (stored[k].shape, stored[k].torch_dtype or torch.uint8)
                          for k in source_keys(source)}  # fmt: skip
                made[id(source)] = converted_shapes(source, shapes, config)
            shape = (made[id(source)] or {}).get(name, tuple(target.shape))
            if shape != tuple(target.shape):
                keys = source_keys(source)
                what = f"{name} made from {keys[0]} and {len(keys) - 1} more"
                refuse_shape(location, what, shape, name, target.shape)


def source_keys(source: Renamed | Converted | Tied | None) -> list[str]:
    """The checkpoint keys a model tensor is read from (none: tied to another, or missing)."""
    if isinstance(source, Renamed):
        return [source.key]
    if isinstance(source, Converted):
        return [key for keys in source.sources.values() for key in keys]
    return []


def refuse_names(location: str, stored: dict[str, Stored], names: Names, kind: str | None) -> None:
    problems = []
    if names.missing:
        more = f" (and {len(names.missing) - 1} more)" if len(names.missing) > 1 else ""
        problems.append(f"it has no value for the model's {names.missing[0]}{more}")
    if names.unexpected:
        key = names.unexpected[0]
        more = f" (and {len(names.unexpected) - 1} more)" if len(names.unexpected) > 1 else ""
        problems.append(f"its {key} (in {stored[key].file}) is no tensor of the model{more}")
    raise WeightsError(
        f"{location} does not match the {f'{kind} ' if kind else ''}model: "
        f"{'; '.join(problems)}; build the model from the config saved with these weights"
    )


def refuse_dtype(folder: Folder, stored: Stored, name: str, target: torch.dtype) -> None:
    """WeightsError unless values stored as `stored.dtype` can become `target` values."""
    if target.is_floating_point:
        fits = stored.dtype in FLOATS
    elif target == torch.bool:
        fits = stored.dtype == "BOOL"
    elif target.is_complex:
        fits = stored.dtype == "C64"
    else:
        fits = stored.dtype[0] in "IU" and stored.torch_dtype is not None
    if not fits:
        hint = (
            "a quantized checkpoint is not read: use one saved in bf16, f16 or f32"
            if target.is_floating_point
            else "save the checkpoint again from this model"
        )
        # A float tensor's dtype is the precision's to choose (fp32 masters, bf16): any float.
        kind = "floating point" if target.is_floating_point else str(target).removeprefix("torch.")
        raise WeightsError(
            f"{folder.join(stored.file)}: {stored.key} is stored as {stored.dtype}, which the "
            f"model's {name} ({kind}) cannot take; {hint}"
        )


def refuse_shape(
    location: str, what: str, shape: tuple[int, ...], name: str, target: torch.Size
) -> None:
    raise WeightsError(
        f"{location}: {what} has shape {list(shape)}, the model's {name} {list(target)}: "
        "build the model from the config saved with these weights"
    )
