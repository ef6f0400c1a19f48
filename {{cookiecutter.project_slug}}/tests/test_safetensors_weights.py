"""Safetensors checkpoints read in place: any slice of any tensor equal to safetensors' own
reading, by the byte ranges that hold it, from a local folder or gs://, and every damaged or
mismatched checkpoint refused in one line before a tensor is read."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from {{ cookiecutter.package_name }}.weights.pretrained import open_pretrained
from {{ cookiecutter.package_name }}.weights.safetensors_io import (
    Stored,
    layout,
    read_checkpoint,
    read_slice,
)
from {{ cookiecutter.package_name }}.weights.storage import Folder, WeightsError

INDEX = "model.safetensors.index.json"
ALL = slice(None)


class Tiny(nn.Module):
    """Tensors of every rank and kind a model holds: floats, integer and boolean buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(40, 12)
        self.blocks = nn.ModuleList(nn.Linear(12, 12) for _ in range(3))
        self.experts = nn.Parameter(torch.zeros(4, 6, 5))
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))
        self.register_buffer("mask", torch.zeros(5, 3, dtype=torch.bool))


def checkpoint_values(seed: int = 0) -> dict[str, torch.Tensor]:
    """Values for every tensor of `Tiny`, the floats stored in bf16 as big checkpoints are."""
    generator = torch.Generator().manual_seed(seed)
    values = {}
    for name, tensor in Tiny().state_dict().items():
        if tensor.is_floating_point():
            values[name] = torch.randn(tensor.shape, generator=generator).to(torch.bfloat16)
        elif tensor.dtype == torch.bool:
            values[name] = torch.rand(tensor.shape, generator=generator) > 0.5
        else:
            values[name] = torch.tensor(1234567, dtype=tensor.dtype)
    return values


def save_sharded(values: dict[str, torch.Tensor], folder: Path, shards: int = 3) -> Path:
    """`values` in `shards` safetensors files and their index, as save_pretrained lays them."""
    folder.mkdir(parents=True, exist_ok=True)
    keys = sorted(values)
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: values[k] for k in keys[i::shards]}, folder / name, {"format": "pt"})
        weight_map.update({k: name for k in keys[i::shards]})
    total = sum(v.numel() * v.element_size() for v in values.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / INDEX).write_text(json.dumps(index))
    return folder


def shard_of(folder: Path, key: str) -> str:
    return str(json.loads((folder / INDEX).read_text())["weight_map"][key])


def meta_tiny() -> Tiny:
    with torch.device("meta"):
        return Tiny()


def whole(shape: torch.Size) -> tuple[slice, ...]:
    return tuple(slice(None) for _ in shape)


def upload(folder: Path, url: str) -> str:
    import fsspec

    fs = fsspec.filesystem("gs")
    for file in folder.iterdir():
        fs.put_file(str(file), f"{url}/{file.name}")
    return url


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    return save_sharded(checkpoint_values(), tmp_path / "saved")


def test_slices_equal_safetensors_own_reading(saved: Path) -> None:
    """It reads slices of every dim, of tensors of every rank, as safetensors' slices give them."""
    folder = Folder(str(saved))
    stored = read_checkpoint(folder)
    cases = {
        "experts": [(slice(1, 3), ALL, ALL), (ALL, slice(2, 5), ALL), (ALL, ALL, slice(1, 4)),
                    (slice(3, 4), slice(0, 1), slice(4, 5)),
                    (slice(1, 3), slice(2, 5), slice(0, 2)), (slice(2, 2), ALL, ALL)],
        "embed.weight": [(slice(10, 30), slice(None)), (slice(None), slice(6, 12))],
        "blocks.1.bias": [(slice(3, 9),)],
        "mask": [(slice(1, 4), slice(1, 2))],
        "step": [()],
    }  # fmt: skip
    for key, indices in cases.items():
        file = saved / stored[key].file
        with safe_open(file, "pt") as own:
            for index in indices:
                values, _ = read_slice(folder, stored[key], index)
                expected = own.get_slice(key)[index] if index else own.get_tensor(key)
                assert values.dtype == expected.dtype, (key, index)
                assert torch.equal(values, expected), (key, index)


def test_dim0_slice_is_one_range_and_later_dims_one_per_row(saved: Path) -> None:
    """It fetches exactly a slice's bytes: one range for dim 0, a range per leading row after."""
    folder = Folder(str(saved))
    experts = read_checkpoint(folder)["experts"]  # [4, 6, 5] bf16
    for index, rows, first in [((slice(1, 3), slice(None), slice(None)), 1, 1 * 30),
                               ((slice(None), slice(2, 5), slice(None)), 4, 2 * 5),
                               ((slice(None), slice(None), slice(1, 4)), 24, 1)]:  # fmt: skip
        values, fetched = read_slice(folder, experts, index)
        starts, length, _ = layout(experts, index)

        assert fetched == values.numel() * 2 == length * rows
        assert len(starts) == rows and int(starts[0]) == experts.start + first * 2


def test_reads_convert_dtype_per_slice(saved: Path) -> None:
    """It reads in the stored dtype and converts each slice; bf16 asked as bf16 stays bf16."""
    weights = open_pretrained(str(saved), meta_tiny())
    expected = checkpoint_values()["embed.weight"]

    as_float = weights.read("embed.weight", (slice(5, 9), slice(None)), torch.float32)
    as_bf16 = weights.read("embed.weight", (slice(5, 9), slice(None)), torch.bfloat16)

    assert as_float.dtype == torch.float32 and torch.equal(as_float, expected[5:9].float())
    assert as_bf16.dtype == torch.bfloat16 and torch.equal(as_bf16, expected[5:9])


def test_plain_module_reads_every_tensor_and_counts_its_bytes(saved: Path) -> None:
    """It gives a plain module every tensor by its state_dict name, counting the bytes read."""
    weights = open_pretrained(str(saved), meta_tiny())
    values = checkpoint_values()

    assert weights.names() == set(values)
    for name, expected in values.items():
        got = weights.read(name, whole(expected.shape), expected.dtype)
        assert torch.equal(got, expected), name
    assert weights.bytes_read == sum(v.numel() * v.element_size() for v in values.values())


def test_a_pickled_copy_reads_the_same_values(saved: Path) -> None:
    """It pickles without its open files, for other processes: a copy reads the same values."""
    weights = open_pretrained(str(saved), meta_tiny())
    expected = weights.read("blocks.0.weight", (slice(2, 7), ALL), torch.float32)

    copy = pickle.loads(pickle.dumps(weights))

    assert torch.equal(copy.read("blocks.0.weight", (slice(2, 7), ALL), torch.float32), expected)


def test_gs_slices_equal_local_ones_and_fetch_only_their_ranges(
    saved: Path, gcs_bucket: str
) -> None:
    """It reads a gs:// copy by byte range: the same slices, a dim-0 slice fetching only itself."""
    remote = open_pretrained(upload(saved, f"{gcs_bucket}/tiny"), meta_tiny())
    local = open_pretrained(str(saved), meta_tiny())

    for name, stored in checkpoint_values().items():
        shape, size = stored.shape, stored.element_size()
        for index in [whole(shape)] + ([(slice(1, 3), *whole(shape)[1:])] if shape else []):
            before = remote.bytes_read
            got = remote.read(name, index, stored.dtype)
            assert torch.equal(got, local.read(name, index, stored.dtype)), (name, index)
            assert remote.bytes_read - before == got.numel() * size, (name, index)


def test_gs_rows_close_together_are_fetched_as_one_range(saved: Path, gcs_bucket: str) -> None:
    """It fetches the gaps between a later dim's rows on gs:// as one request (or skips them
    with no gap allowed), and splits a range longer than a part; the values stay the same."""
    url = upload(saved, f"{gcs_bucket}/tiny")
    index = (slice(None), slice(None), slice(1, 3))  # 24 rows of 4 bytes, 6 bytes apart
    expected, _ = read_slice(Folder(str(saved)), read_checkpoint(Folder(str(saved)))["experts"],
                             index)  # fmt: skip

    for gap, part, fetched_bytes in [(0, 1 << 20, 24 * 4), (1 << 20, 1 << 20, 23 * 10 + 4),
                                     (1 << 20, 7, 23 * 10 + 4)]:  # fmt: skip
        folder = Folder(url, gap=gap, part=part)
        values, fetched = read_slice(folder, read_checkpoint(folder)["experts"], index)
        assert torch.equal(values, expected) and fetched == fetched_bytes, (gap, part)


def test_missing_shard_is_refused_by_name(saved: Path) -> None:
    """It refuses a checkpoint whose index names a shard that is not there, naming both."""
    (saved / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(WeightsError) as error:
        open_pretrained(str(saved), meta_tiny())
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{saved}/model-00002-of-00003.safetensors is missing: {INDEX} puts")


def test_truncated_file_is_refused(saved: Path) -> None:
    """It refuses a shard cut short, naming the tensor that runs past its end."""
    shard = saved / "model-00003-of-00003.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[:-10])
    with pytest.raises(WeightsError) as error:
        open_pretrained(str(saved), meta_tiny())
    assert str(error.value).startswith(f"{shard} is cut short: ")
    assert f"ends at byte {len(data)}, the file at {len(data) - 10}" in str(error.value)


def test_header_that_does_not_parse_is_refused(saved: Path) -> None:
    """It refuses a shard whose header is not JSON, naming the file."""
    shard = saved / "model-00001-of-00003.safetensors"
    data = bytearray(shard.read_bytes())
    data[8:12] = b"\x00ab{"
    shard.write_bytes(bytes(data))
    with pytest.raises(WeightsError) as error:
        open_pretrained(str(saved), meta_tiny())
    assert str(error.value).startswith(f"{shard}: its header does not parse as safetensors (")


def test_header_longer_than_its_file_is_refused(tmp_path: Path) -> None:
    """It refuses a file cut inside its header."""
    folder = save_sharded(checkpoint_values(), tmp_path / "saved", shards=1)
    shard = folder / "model-00001-of-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:40])
    with pytest.raises(WeightsError) as error:
        open_pretrained(str(folder), meta_tiny())
    assert str(error.value).startswith(f"{shard} is cut short: its header alone is ")


def test_quantized_tensor_for_a_float_parameter_is_refused(tmp_path: Path) -> None:
    """It refuses int8 values for a float parameter, naming the key and the stored dtype."""
    values = checkpoint_values()
    values["blocks.2.weight"] = values["blocks.2.weight"].to(torch.int8)
    folder = save_sharded(values, tmp_path / "saved")
    with pytest.raises(WeightsError) as error:
        open_pretrained(str(folder), meta_tiny())
    message = str(error.value)
    assert "blocks.2.weight is stored as I8, which the model's blocks.2.weight (floating point) " \
           "cannot take; a quantized checkpoint is not read" in message  # fmt: skip
    assert "\n" not in message


def test_float8_tensor_for_a_float_parameter_is_refused(tmp_path: Path) -> None:
    """It refuses float8 values for a float parameter: scales it does not apply sit elsewhere."""
    values = checkpoint_values()
    values["experts"] = values["experts"].to(torch.float8_e4m3fn)
    folder = save_sharded(values, tmp_path / "saved")
    with pytest.raises(WeightsError, match=r"experts is stored as F8_E4M3, which the model's "
                                           r"experts \(floating point\) cannot take"):  # fmt: skip
        open_pretrained(str(folder), meta_tiny())


def test_plain_module_mismatch_names_first_missing_and_unexpected(tmp_path: Path) -> None:
    """It refuses a checkpoint without a model tensor and with one the model lacks, naming both."""
    values = checkpoint_values()
    values["blocks.3.weight"] = values.pop("blocks.0.weight")
    folder = save_sharded(values, tmp_path / "saved")
    with pytest.raises(WeightsError) as error:
        open_pretrained(str(folder), meta_tiny())
    assert str(error.value) == (
        f"{folder} does not match the model: it has no value for the model's "
        f"blocks.0.weight; its blocks.3.weight (in {shard_of(folder, 'blocks.3.weight')}) is no "
        "tensor of the model; build the model from the config saved with these weights"
    )


def test_shape_mismatch_names_both_shapes(tmp_path: Path) -> None:
    """It refuses a tensor stored in another shape than the model's, giving both."""
    values = checkpoint_values()
    values["embed.weight"] = values["embed.weight"][:30]
    folder = save_sharded(values, tmp_path / "saved")
    with pytest.raises(WeightsError) as error:
        open_pretrained(str(folder), meta_tiny())
    assert str(error.value).startswith(
        f"{folder}: embed.weight (in {shard_of(folder, 'embed.weight')}) has shape [30, 12], the "
        "model's embed.weight [40, 12]: "
    )


def test_folder_without_safetensors_is_refused(tmp_path: Path) -> None:
    """It refuses a folder holding only pickled weights, naming the file it does not read."""
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickled")
    with pytest.raises(WeightsError) as error:
        open_pretrained(str(tmp_path), meta_tiny())
    assert str(error.value) == (
        f"{tmp_path} holds no safetensors weights (no model.safetensors, no {INDEX}): "
        "pytorch_model.bin is not read; save the model again with save_pretrained"
    )


def test_gs_folder_that_does_not_exist_is_refused(gcs_bucket: str) -> None:
    """It refuses a gs:// folder that is not there, in one line."""
    with pytest.raises(WeightsError) as error:
        open_pretrained(f"{gcs_bucket}/nowhere", meta_tiny())
    assert str(error.value) == f"{gcs_bucket}/nowhere does not exist (or is not a folder)"


def test_gs_folder_without_safetensors_is_refused(gcs_bucket: str, tmp_path: Path) -> None:
    """It refuses a gs:// folder with no safetensors weights in it."""
    (tmp_path / "config.json").write_text("{}")
    url = upload(tmp_path, f"{gcs_bucket}/config-only")
    with pytest.raises(WeightsError) as error:
        open_pretrained(url, meta_tiny())
    expected = f"{url} holds no safetensors weights (no model.safetensors, no {INDEX})"
    assert str(error.value) == expected


def test_stored_sizes_are_checked_against_their_shapes(saved: Path) -> None:
    """It refuses a header whose byte span does not fit its tensor's shape and dtype."""
    shard = saved / "model-00001-of-00003.safetensors"
    data = shard.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    key = next(k for k in header if k != "__metadata__" and header[k]["shape"])
    header[key]["shape"][0] -= 1  # one row fewer than its bytes hold
    raw = json.dumps(header, separators=(",", ":")).encode().ljust(length)
    shard.write_bytes(data[:8] + raw + data[8 + length :])
    with pytest.raises(WeightsError, match=rf"^{shard}: its header does not parse as safetensors "
                                           rf"\({key} spans bytes"):  # fmt: skip
        open_pretrained(str(saved), meta_tiny())


def test_stored_records_lie_after_the_header(saved: Path) -> None:
    """It places each tensor after its file's header: offsets are the file's, not the data's."""
    for stored in read_checkpoint(Folder(str(saved))).values():
        assert isinstance(stored, Stored)
        length = int.from_bytes((saved / stored.file).read_bytes()[:8], "little")
        assert stored.start >= 8 + length
