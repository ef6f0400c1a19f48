"""The Hugging Face Hub layout of a transformers model, planned on the meta device: the tensors,
files and index its `save_pretrained` writes, and which of the model's tensors each written
tensor is converted from, so they can be written a few at a time.

transformers stays the source of truth: its `remove_tied_weights_from_state_dict` picks the
tied names kept, its `revert_weight_conversion` gives the checkpoint's names (a mixture's
stacked experts back to one tensor per expert, ...), huggingface_hub's split (the one
save_pretrained calls) cuts the files, with the storage sizes and sharing the real tensors
would have.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .safetensors_files import TensorSpec

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"


class ConversionError(ValueError):
    """A model whose weight conversions cannot be applied a few tensors at a time."""


@dataclass
class HubPlan:
    files: dict[str, list[TensorSpec]]  # file name -> the tensors it holds
    groups: list[list[str]]  # the model's tensors converted together, in the model's order
    converts: bool  # False: every tensor is written as the model holds it, under its name
    index: dict[str, Any] | None  # model.safetensors.index.json, when there are several files


def plan_hub(model: Any, max_shard_size: int | str) -> HubPlan:
    """What `model.save_pretrained(..., max_shard_size=...)` writes, for `model` on meta."""
    from huggingface_hub.serialization import split_state_dict_into_shards_factory
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    state = model.state_dict()
    for key in getattr(model, "_keys_to_ignore_on_save", None) or ():
        state.pop(key, None)
    state = remove_tied_weights_from_state_dict(state, model)
    written = revert_weight_conversion(model, state)
    converts = written is not state
    groups = conversion_groups(model, state, written) if converts else [[k] for k in state]
    split = split_state_dict_into_shards_factory(
        written, get_storage_size=_storage_size, get_storage_id=_storage_id,
        filename_pattern=WEIGHTS_NAME.replace(".safetensors", "{suffix}.safetensors"),
        max_shard_size=max_shard_size,
    )  # fmt: skip

    def spec(name: str) -> TensorSpec:
        return TensorSpec(name, written[name].dtype, tuple(written[name].shape))

    files = {
        filename: [spec(name) for name in names]
        for filename, names in split.filename_to_tensors.items()
    }
    index = None
    if split.is_sharded:
        metadata = {"total_parameters": model.num_parameters(), **split.metadata}
        index = {"metadata": metadata, "weight_map": split.tensor_to_filename}
    return HubPlan(files, groups, converts, index)


def convert(model: Any, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A group's tensors under the names (and in the shapes) the checkpoint format has."""
    from transformers.core_model_loading import revert_weight_conversion

    return dict(revert_weight_conversion(model, tensors))


def conversion_groups(
    model: Any, state: dict[str, Any], written: dict[str, Any]
) -> list[list[str]]:
    """The model's tensors in groups that convert on their own: one tensor each, unless a
    written tensor is made of several (they share a group). Checked against the whole
    conversion: each group must give exactly its part of it."""
    keys: dict[str, list[str]] = {}
    for name, tensor in state.items():
        try:
            keys[name] = list(convert(model, {name: tensor}))
        except Exception as error:  # a conversion missing its other inputs
            raise ConversionError(_refusal(model, name, error)) from None
    groups: list[list[str]] = []
    group_of: dict[str, int] = {}  # written name -> its group
    for name in state:
        hits = sorted({group_of[key] for key in keys[name] if key in group_of})
        target = hits[0] if hits else len(groups)
        if not hits:
            groups.append([])
        for other in hits[1:]:  # a written tensor made of this one and others: one group
            groups[target] += groups[other]
            groups[other] = []
        groups[target].append(name)
        for member in groups[target]:
            for key in keys[member]:
                group_of[key] = target
    order = {name: i for i, name in enumerate(state)}
    groups = [sorted(group, key=order.__getitem__) for group in groups if group]
    seen: set[str] = set()
    for group in groups:
        part = convert(model, {name: state[name] for name in group})
        for key, tensor in part.items():
            stored = written.get(key)
            if key in seen or stored is None or stored.shape != tensor.shape:
                raise ConversionError(_refusal(model, group[0], None))
            seen.add(key)
    if seen != set(written):
        raise ConversionError(_refusal(model, next(iter(state)), None))
    return groups


def _refusal(model: Any, name: str, error: BaseException | None) -> str:
    why = f": {str(error).splitlines()[0]}" if error is not None and str(error) else ""
    return (
        f"{type(model).__name__}'s conversion to its checkpoint format does not apply a few "
        f"tensors at a time (at {name!r}{why})"
    )


def _storage_size(tensor: torch.Tensor) -> int:
    from huggingface_hub.serialization import get_torch_storage_size

    return int(get_torch_storage_size(tensor))


def _storage_id(tensor: torch.Tensor) -> Any:
    """What huggingface_hub's `get_torch_storage_id` gives the real tensor: tensors of one
    storage (a written tensor's views of one converted tensor) share it. A meta tensor has
    no address, so its storage object's stands in (views keep their base's storage)."""
    from huggingface_hub.serialization import get_torch_storage_id

    if tensor.device.type != "meta":
        return get_torch_storage_id(tensor)
    storage = tensor.untyped_storage()
    address = storage._cdata if storage.nbytes() else 0  # empty storages are all at 0
    return ("cpu", address, storage.nbytes())
