"""Safetensors checkpoints read in place: every file's header, then any slice of a tensor by the
byte ranges that hold it.

A safetensors file is an 8-byte little-endian header length, a JSON header (`{key: {"dtype",
"shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`), then the data, each tensor
contiguous in C order. So a slice of dim 0 is one byte range, and a slice of a later dim one
range per row of the dims before it, a row running to the end of the dims that are whole. A
checkpoint folder holds `model.safetensors`, or shards named by `model.safetensors.index.json`
(`weight_map`: key -> file), as `save_pretrained` writes them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import torch

from .storage import Folder, WeightsError

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
HEADER_LENGTH = 8  # bytes: the header's length, little-endian

# Each safetensors dtype by the torch dtype's name, and its size in bits.
DTYPE_NAMES = {
    "BOOL": ("bool", 8), "U8": ("uint8", 8), "I8": ("int8", 8), "F8_E4M3": ("float8_e4m3fn", 8),
    "F8_E5M2": ("float8_e5m2", 8), "F8_E8M0": ("float8_e8m0fnu", 8), "I16": ("int16", 16),
    "U16": ("uint16", 16), "F16": ("float16", 16), "BF16": ("bfloat16", 16),
    "I32": ("int32", 32), "U32": ("uint32", 32), "F32": ("float32", 32), "I64": ("int64", 64),
    "U64": ("uint64", 64), "F64": ("float64", 64), "C64": ("complex64", 64), "F4": ("", 4),
}  # fmt: skip
FLOATS = ("F16", "BF16", "F32", "F64")  # what a floating-point model tensor is read from


@dataclass(frozen=True)
class Stored:
    """Where one tensor lies: its file, dtype (safetensors' name), shape and first byte."""

    key: str
    file: str
    dtype: str
    shape: tuple[int, ...]
    start: int

    @property
    def torch_dtype(self) -> torch.dtype | None:
        """The torch dtype its values are read as; None: torch has none."""
        name = DTYPE_NAMES.get(self.dtype, ("", 0))[0]
        return getattr(torch, name, None) if name else None


def read_checkpoint(folder: Folder) -> dict[str, Stored]:
    """Every tensor of a checkpoint folder by its key, from the files' headers alone."""
    try:
        sizes = folder.sizes()
    except (FileNotFoundError, NotADirectoryError):
        raise WeightsError(f"{folder.location} does not exist (or is not a folder)") from None
    if INDEX in sizes:
        try:
            weight_map = dict(json.loads(folder.read_file(INDEX))["weight_map"])
        except (ValueError, KeyError, TypeError) as error:
            raise WeightsError(f"{folder.join(INDEX)} does not parse: {error}") from None
        files = sorted(set(weight_map.values()))
        for name in files:
            if name not in sizes:
                key = next(k for k, file in weight_map.items() if file == name)
                raise WeightsError(
                    f"{folder.join(name)} is missing: {INDEX} puts {key} there; copy the "
                    "whole checkpoint folder again"
                )
    elif SINGLE in sizes:
        weight_map, files = {}, [SINGLE]
    else:
        pickled = sorted(name for name in sizes if name.endswith(".bin"))
        message = f"{folder.location} holds no safetensors weights (no {SINGLE}, no {INDEX})"
        if pickled:
            message += f": {pickled[0]} is not read; save the model again with save_pretrained"
        raise WeightsError(message)
    stored = {s.key: s for header in read_headers(folder, files, sizes) for s in header}
    for key, name in weight_map.items():
        if key not in stored or stored[key].file != name:
            raise WeightsError(f"{folder.join(name)} has no tensor {key}, which {INDEX} puts there")
    return stored


def read_headers(folder: Folder, files: list[str], sizes: dict[str, int]) -> list[list[Stored]]:
    """Each file's tensors: two rounds of requests (lengths, then headers), whatever the count."""
    for name in files:
        if sizes[name] < HEADER_LENGTH:
            raise WeightsError(f"{folder.join(name)} is cut short: {sizes[name]} bytes, no header")
    prefixes = folder.read_ranges([(name, 0, HEADER_LENGTH) for name in files])
    lengths = [int.from_bytes(prefix, "little") for prefix in prefixes]
    for name, length in zip(files, lengths, strict=True):
        if HEADER_LENGTH + length > sizes[name]:
            raise WeightsError(
                f"{folder.join(name)} is cut short: its header alone is {length} bytes, the file "
                f"{sizes[name]}; copy it again"
            )
    raws = folder.read_ranges([(name, HEADER_LENGTH, HEADER_LENGTH + n)
                               for name, n in zip(files, lengths, strict=True)])  # fmt: skip
    return [parse_header(folder, name, raw, sizes[name])
            for name, raw in zip(files, raws, strict=True)]  # fmt: skip


def parse_header(folder: Folder, name: str, raw: bytes, size: int) -> list[Stored]:
    """The tensors a header names, each checked to lie inside the file."""
    data = HEADER_LENGTH + len(raw)
    found = []
    try:
        header = json.loads(raw)
        for key, info in header.items():
            if key == "__metadata__":
                continue
            begin, end = (int(x) for x in info["data_offsets"])
            shape = tuple(int(n) for n in info["shape"])
            bits = DTYPE_NAMES[info["dtype"]][1] if info["dtype"] in DTYPE_NAMES else None
            if begin > end or (bits is not None and (end - begin) * 8 != math.prod(shape) * bits):
                raise ValueError(f"{key} spans bytes {begin}-{end}, not a {shape} {info['dtype']}")
            if data + end > size:
                raise WeightsError(
                    f"{folder.join(name)} is cut short: {key} ends at byte {data + end}, the file "
                    f"at {size}; copy it again"
                )
            found.append(Stored(key, name, str(info["dtype"]), shape, data + begin))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        if isinstance(error, WeightsError):
            raise
        raise WeightsError(
            f"{folder.join(name)}: its header does not parse as safetensors ({error}); the file "
            "is damaged: copy it again"
        ) from None
    return found


def layout(stored: Stored, index: tuple[slice, ...]) -> tuple[np.ndarray, int, tuple[int, ...]]:
    """The first byte of each row a slice reads (in order), a row's length, the slice's shape."""
    shape = stored.shape
    bounds = slice_bounds(stored.key, index, shape)
    out = tuple(stop - start for start, stop in bounds)
    assert stored.torch_dtype is not None
    item = stored.torch_dtype.itemsize
    # The rows end at the last dim that is not whole: the whole dims after it are contiguous.
    split = len(shape)
    while split and bounds[split - 1] == (0, shape[split - 1]):
        split -= 1
    if split == 0:
        return np.array([stored.start], dtype=np.int64), math.prod(shape) * item, out
    inner = math.prod(shape[split:]) * item  # bytes per step of the rows' own dim
    starts = np.array([stored.start + bounds[split - 1][0] * inner], dtype=np.int64)
    stride = shape[split - 1] * inner
    for dim in reversed(range(split - 1)):
        steps = np.arange(*bounds[dim], dtype=np.int64) * stride
        starts = (steps[:, None] + starts[None, :]).ravel()  # this dim the slower
        stride *= shape[dim]
    return starts, out[split - 1] * inner, out


def slice_bounds(
    name: str, index: tuple[slice, ...], shape: tuple[int, ...]
) -> list[tuple[int, int]]:
    """Each slice's (start, stop) within `shape`; ValueError for a wrong count or a step."""
    if len(index) != len(shape):
        raise ValueError(f"{name} has {len(shape)} dims, the index {len(index)} slices")
    bounds = []
    for part, size in zip(index, shape, strict=True):
        start, stop, step = part.indices(size)
        if step != 1:
            raise ValueError(f"{name}: slices are read with step 1, not {step}")
        bounds.append((start, max(start, stop)))
    return bounds


def read_slice(
    folder: Folder, stored: Stored, index: tuple[slice, ...]
) -> tuple[torch.Tensor, int]:
    """The values of `stored` at `index` in its own dtype, and the bytes fetched for them."""
    starts, length, shape = layout(stored, index)
    assert stored.torch_dtype is not None
    out = torch.empty(shape, dtype=stored.torch_dtype)
    if out.numel() == 0:
        return out, 0
    into = out.view(-1).view(torch.uint8).numpy()
    return out, folder.read_rows(stored.file, starts, length, into)
