"""safetensors files written one tensor at a time: every file's layout is fixed before any
data, from the tensors' names, dtypes and shapes, so each tensor goes straight to its offset.

The layout is the one the safetensors library writes (its `save_file` gives the same bytes):
an 8-byte little-endian header length, a JSON header (`__metadata__` first, then each tensor's
dtype, shape and byte range, in the order of the data) padded with spaces to a multiple of 8,
then the data, the wider dtypes first (every tensor aligned to its element size), by name
within a dtype.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

# safetensors' dtype names, narrowest first (the order of its own table): data is laid out
# from the end of this list to its start.
_NAMES = (
    (torch.bool, "BOOL"), (torch.uint8, "U8"), (torch.int8, "I8"),
    (torch.float8_e5m2, "F8_E5M2"), (torch.float8_e4m3fn, "F8_E4M3"),
    (torch.int16, "I16"), (torch.uint16, "U16"), (torch.float16, "F16"),
    (torch.bfloat16, "BF16"), (torch.int32, "I32"), (torch.uint32, "U32"),
    (torch.float32, "F32"), (torch.complex64, "C64"), (torch.float64, "F64"),
    (torch.int64, "I64"), (torch.uint64, "U64"),
)  # fmt: skip
DTYPE_NAMES = dict(_NAMES)
_WIDTH_RANK = {dtype: rank for rank, (dtype, _) in enumerate(_NAMES)}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a file: what the header says of it."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * self.dtype.itemsize


def layout(
    specs: Iterable[TensorSpec], metadata: Mapping[str, str]
) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """A file's header bytes (length prefix included) and each tensor's byte range in its data."""
    ordered = sorted(specs, key=lambda spec: (-_rank(spec.dtype), spec.name))
    entries: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    ranges: dict[str, tuple[int, int]] = {}
    start = 0
    for spec in ordered:
        ranges[spec.name] = (start, start + spec.nbytes)
        entries[spec.name] = {"dtype": DTYPE_NAMES[spec.dtype], "shape": list(spec.shape),
                              "data_offsets": [start, start + spec.nbytes]}  # fmt: skip
        start += spec.nbytes
    text = json.dumps(entries, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, ranges


def _rank(dtype: torch.dtype) -> int:
    if dtype not in _WIDTH_RANK:
        raise ValueError(f"safetensors has no dtype for {dtype}")
    return _WIDTH_RANK[dtype]


class FilesWriter:
    """Files in `folder` whose headers are written first; then `write(name, tensor)` puts
    each tensor at its place, in any order. `close()` checks that every tensor came."""

    def __init__(self, folder: Path, files: Mapping[str, list[TensorSpec]],
                 metadata: Mapping[str, str]) -> None:  # fmt: skip
        self.where: dict[str, tuple[Path, TensorSpec, int]] = {}  # name -> file, spec, offset
        for filename, specs in files.items():
            path = folder / filename
            header, ranges = layout(specs, metadata)
            with path.open("wb") as out:
                out.write(header)
                out.truncate(len(header) + sum(spec.nbytes for spec in specs))
            for spec in specs:
                self.where[spec.name] = (path, spec, len(header) + ranges[spec.name][0])

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Write tensor `name` at its offset (its dtype and shape as planned)."""
        path, spec, offset = self.where.pop(name)
        if tensor.dtype != spec.dtype or tuple(tensor.shape) != spec.shape:
            raise ValueError(
                f"tensor {name!r} is {tensor.dtype} {tuple(tensor.shape)}, planned as "
                f"{spec.dtype} {spec.shape}"
            )
        data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().data
        descriptor = os.open(path, os.O_WRONLY)
        try:
            written = os.pwrite(descriptor, data, offset)
            while written < data.nbytes:  # pwrite may write less than asked
                written += os.pwrite(descriptor, data[written:], offset + written)
        finally:
            os.close(descriptor)

    def close(self) -> None:
        """Raise if a planned tensor was never written."""
        if self.where:
            missing = sorted(self.where)
            raise ValueError(
                f"{len(missing)} planned tensor(s) were not written: {missing[0]!r}, ..."
            )
