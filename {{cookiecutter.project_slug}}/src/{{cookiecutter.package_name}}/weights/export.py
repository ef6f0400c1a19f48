"""Export without a gather: a run's model written tensor by tensor, from its checkpoint (and,
for a LoRA run, its frozen base merged with the trained adapters), so no process ever holds
more than one tensor of the model (with its converted or merged copy) at a time.

The model is built on the meta device (names, shapes, dtypes, ties; nothing allocated), each
file's layout is planned from it before any data, and every tensor is then read, converted
and written at its offset (`safetensors_files.py`). Two layouts: the Hugging Face Hub's
(`hub_layout.py`: what transformers' `save_pretrained` writes, sharded with an index) and the
project's single file (`load_exported`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..core.checkpoint_files import CheckpointError, failures, reader, reason
from ..core.materialize import Source, parameter_groups, whole
from .safetensors_files import FilesWriter, TensorSpec

CHECKPOINT_PREFIX = "model."  # where a run's checkpoint keeps the model's tensors


class ExportError(ValueError):
    """A model or destination the export cannot write; the message says why."""


class CheckpointTensors:
    """The model tensors of a torch.distributed.checkpoint folder (local or any fsspec URL),
    read one per `dcp.load` through one reader, whatever layout the run saved them in."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.reader = reader(location)
        try:
            metadata = self.reader.read_metadata()
        except failures() as error:
            raise CheckpointError(f"cannot read checkpoint {location!r}: {reason(error)}") from None
        # dcp.load asks for the metadata on every call: read (and on gs://, fetch) it once.
        self.reader.read_metadata = lambda *args, **kwargs: metadata
        self.saved = {
            key.removeprefix(CHECKPOINT_PREFIX): entry
            for key, entry in metadata.state_dict_metadata.items()
            if key.startswith(CHECKPOINT_PREFIX) and hasattr(entry, "chunks")  # tensors only
        }

    def __contains__(self, name: str) -> bool:
        return name in self.saved

    def read(self, name: str) -> torch.Tensor:
        """Tensor `name` of the model, whole, on the host, as it was saved."""
        import torch.distributed.checkpoint as dcp

        entry = self.saved[name]
        tensor = torch.empty(tuple(entry.size), dtype=entry.properties.dtype)
        try:
            dcp.load({"model": {name: tensor}}, storage_reader=self.reader)
        except failures() as error:
            raise CheckpointError(
                f"cannot read {name!r} from checkpoint {self.location!r}: {reason(error)}"
            ) from None
        return tensor


def plain_model(model: nn.Module) -> nn.Module:
    """The model as exported: a LoRA run's base without its adapters (peft's `unload` of a
    copy; on the meta device the copy costs nothing), the model itself otherwise."""
    from ..hf.lora import is_lora

    if not is_lora(model):
        return model
    return copy.deepcopy(model).unload()  # type: ignore[no-any-return,operator]


class ModelValues:
    """Each tensor of the exported model, under its exported (plain) name, one at a time, from
    where the run keeps it: the checkpoint; a LoRA run's frozen base from the run's own source
    (its pretrained weights or seeded initialization), each adapted layer merged by peft's
    own `merge` on host copies of that layer's tensors; a buffer the checkpoint lacks from
    the model as built."""

    def __init__(
        self, model: nn.Module, source: Source | None, checkpoint: CheckpointTensors
    ) -> None:
        from ..hf.lora import base_name, is_lora

        self.model, self.source, self.checkpoint = model, source, checkpoint
        self.lora = is_lora(model)
        self.tensors: dict[str, nn.Parameter | torch.Tensor] = {}
        self.aliases: dict[str, list[str]] = {}  # a tied parameter's names, the first first
        for names, param in parameter_groups(model):
            for name in names:
                self.tensors[name] = param
                self.aliases[name] = names
        for name, buffer in model.named_buffers():
            self.tensors[name] = buffer
            self.aliases[name] = [name]
        self.run_name = {base_name(name): name for name in self.tensors}  # plain -> the run's
        self.layers = {
            name: module
            for name, module in model.named_modules()
            if self.lora and hasattr(module, "base_layer") and hasattr(module, "merge")
        }
        self._merged: tuple[str, dict[str, torch.Tensor]] | None = None

    def read(self, plain: str) -> torch.Tensor:
        """The exported tensor `plain` (the name in the plain model) on the host."""
        name = self.run_name[plain]
        layer = name.split(".base_layer.")[0] if ".base_layer." in name else None
        if layer is None or layer not in self.layers:
            return self._run_value(name)
        if self._merged is None or self._merged[0] != layer:
            self._merged = None  # the previous layer's tensors go before this layer's come
            self._merged = (layer, self._merge(layer))
        return self._merged[1][name]

    def cached(self) -> dict[str, torch.Tensor]:
        """The tensors kept between reads: the merged layer being written."""
        return dict(self._merged[1]) if self._merged is not None else {}

    def _run_value(self, name: str) -> torch.Tensor:
        """Tensor `name` of the run's model as the run holds it, on the host."""
        like = self.tensors[name]
        saved = next((alias for alias in self.aliases[name] if alias in self.checkpoint), None)
        if saved is not None:
            value = self.checkpoint.read(saved)
        elif not like.is_meta and (self.lora or not isinstance(like, nn.Parameter)):
            value = like.detach()  # a buffer, or a LoRA base built whole on the host
        elif self.lora and self.source is not None and isinstance(like, nn.Parameter):
            value = self.source.read(self.aliases[name][0], whole(like.shape), like.dtype)
        else:
            raise CheckpointError(
                f"checkpoint {self.checkpoint.location!r} holds no tensor {name!r} of the model"
            )
        return value.to(like.dtype)

    def _merge(self, layer_name: str) -> dict[str, torch.Tensor]:
        """A LoRA layer's base tensors with its adapters merged, as peft's merge_and_unload
        merges them: its own `merge()`, run on host copies of the layer's tensors."""
        layer = self.layers[layer_name]
        slots = []
        for local, param in layer.named_parameters(remove_duplicate=False):
            owner_name, _, leaf = local.rpartition(".")
            owner = layer.get_submodule(owner_name) if owner_name else layer
            host = self._run_value(f"{layer_name}.{local}")
            slots.append((f"{layer_name}.{local}", owner, leaf, param))
            owner._parameters[leaf] = nn.Parameter(host, requires_grad=False)
        merged_before = list(layer.merged_adapters)  # type: ignore[arg-type]
        try:
            with torch.no_grad():
                layer.merge()  # type: ignore[operator]
            values = {name: owner._parameters[leaf].detach()  # type: ignore[union-attr]
                      for name, owner, leaf, _ in slots if ".base_layer." in name}  # fmt: skip
        finally:
            for _, owner, leaf, param in slots:
                owner._parameters[leaf] = param
            layer.merged_adapters[:] = merged_before  # type: ignore[index]
        return values


class Held:
    """The most host memory the tensors of one step (read, converted, written) took."""

    def __init__(self) -> None:
        self.largest = 0

    def note(self, *groups: Mapping[str, torch.Tensor]) -> None:
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                    for group in groups for t in group.values()}  # fmt: skip
        self.largest = max(self.largest, sum(storages.values()))


def spec_of(name: str, tensor: torch.Tensor) -> TensorSpec:
    return TensorSpec(name, tensor.dtype, tuple(tensor.shape))


@contextlib.contextmanager
def written_whole(out: Path, directory: bool) -> Iterator[Path]:
    """A scratch path beside `out` to write into, moved onto `out` when the block ends
    without error (else removed): an interrupted export leaves nothing that looks written.
    A directory `out` must be new or empty, a file `out` new."""
    if directory and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"--out {str(out)!r} exists and is not empty: choose a new directory")
    if not directory and out.exists():
        raise ExportError(f"--out {str(out)!r} exists: choose a new file")
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        partial = scratch / "export"
        if directory:
            partial.mkdir()
        yield partial
        if directory and out.exists():
            out.rmdir()  # empty, checked above
        partial.rename(out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def export_hf(model: nn.Module, source: Source | None, checkpoint: str, out: Path,
              max_shard_size: int | str, tokenizer: Any) -> dict[str, Any]:  # fmt: skip
    """A run's transformers model (built on meta, LoRA adapters merged) into the directory
    `out` in the Hub layout, its weights read from `checkpoint` one tensor at a time."""
    from ..hf.common import unwrap
    from ..hf.export import save_model_files
    from .hub_layout import INDEX_NAME, ConversionError, convert, plan_hub

    plain = plain_model(model)
    inner = unwrap(plain)
    if inner is None:
        raise ExportError(
            f"the model is a {type(model).__name__}, not a Hugging Face transformers model: "
            "export it with --format safetensors"
        )
    prefix = next(name for name, module in plain.named_modules() if module is inner)
    prefix += "." if prefix else ""
    with written_whole(out, directory=True) as folder:
        try:
            plan = plan_hub(inner, max_shard_size)
        except ConversionError as error:
            raise ExportError(str(error)) from None
        values = ModelValues(model, source, CheckpointTensors(checkpoint))
        held = Held()
        writer = FilesWriter(folder, plan.files, {"format": "pt"})
        for group in plan.groups:
            read = {name: values.read(prefix + name) for name in group}
            written = convert(inner, read) if plan.converts else read
            held.note(read, written, values.cached())
            for name, tensor in written.items():
                writer.write(name, tensor)
            del read, written
        writer.close()
        if plan.index is not None:
            index = json.dumps(plan.index, indent=2, sort_keys=True)
            (folder / INDEX_NAME).write_text(index + "\n")
        save_model_files(inner, tokenizer, folder)
    return {"files": sorted(plan.files), "largest_held_bytes": held.largest,
            "parameters": parameter_count(plain)}  # fmt: skip


def export_single_file(model: nn.Module, source: Source | None, checkpoint: str, out: Path,
                       metadata: Mapping[str, str]) -> dict[str, Any]:  # fmt: skip
    """A run's model (LoRA adapters merged) into the single safetensors file `out`, with
    `metadata`: its state under the model's own names, a tied tensor once under its first
    name in sorted order (what safetensors' `save_model` keeps and `load_model` re-ties)."""
    plain = plain_model(model)
    tied = {name: min(names) for names, _ in parameter_groups(plain) for name in names}
    state = plain.state_dict(keep_vars=True)
    names = [name for name in state if tied.get(name, name) == name]
    with written_whole(out, directory=False) as path:
        values = ModelValues(model, source, CheckpointTensors(checkpoint))
        held = Held()
        specs = {path.name: [spec_of(name, state[name]) for name in names]}
        writer = FilesWriter(path.parent, specs, metadata)
        for name in names:
            value = values.read(name)
            held.note({name: value}, values.cached())
            writer.write(name, value)
            del value
        writer.close()
    return {"files": [out.name], "largest_held_bytes": held.largest,
            "parameters": parameter_count(plain)}  # fmt: skip


def export_adapter(model: nn.Module, checkpoint: str, out: Path, tokenizer: Any) -> dict[str, Any]:
    """A LoRA run's adapters alone (for peft) into the directory `out`: read from the
    checkpoint into the meta-device model, whose base is never read, and saved by peft."""
    from ..core.materialize import replace_parameter
    from ..hf.export import save_adapter

    with written_whole(out, directory=True) as folder:
        saved = CheckpointTensors(checkpoint)
        largest = parameters = 0
        for names, param in list(parameter_groups(model)):
            if param.requires_grad:  # what a LoRA run trains and saves
                value = saved.read(names[0]).to(param.dtype)
                replace_parameter(model, names, value, param)
                largest, parameters = max(largest, value.nbytes), parameters + value.numel()
        save_adapter(model, tokenizer, folder)
        files = sorted(path.name for path in folder.iterdir())
    return {"files": files, "largest_held_bytes": largest, "parameters": parameters}


def parameter_count(model: nn.Module) -> int:
    """Elements of the model's parameters, a tied one once."""
    return sum(param.numel() for param in model.parameters())
