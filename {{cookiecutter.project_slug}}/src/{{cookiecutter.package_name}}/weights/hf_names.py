"""Which checkpoint keys give each model tensor its values, decided from names and shapes alone.

A `transformers` model's own mappings are the source of truth, as `from_pretrained` drives them
(`convert_and_load_state_dict_in_model`): each key goes through the model's renamings, then at
most one weight converter (`get_model_conversion_mapping`, `rename_source_key`), and a base
model's checkpoint loads into a model with a head and back. A renamed key is read by slice; a
converter's target (a mixture of experts' `experts.N.w1 ... w3` stacked into one
`experts.gate_up_proj`) is made by transformers' own operations from its source tensors. Tied
weights missing from a checkpoint share the values of the one it has. Any other module: keys
are its state_dict names.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Iterable
from copy import deepcopy
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class Renamed:
    """A model tensor stored under one key: its own name, or the one it had before a rename."""

    key: str


@dataclass(eq=False)
class Converted:
    """Model tensors made by one weight converter from whole source tensors (one group)."""

    first: str  # the name transformers gives the group: its first target
    converter: Any  # a WeightConverter, kept empty: each conversion fills a copy
    sources: dict[str, list[str]] = field(default_factory=dict)  # pattern -> keys, in order
    per_expert: bool = False  # dim 0 of each target is the index into each source list


@dataclass(frozen=True)
class Tied:
    """A model tensor tied to another one, whose values the checkpoint holds."""

    name: str


Source = Renamed | Converted | Tied


@dataclass
class Names:
    """Each model tensor's source; what the checkpoint lacks, and what it has beyond."""

    sources: dict[str, Source]
    missing: list[str]  # model names, in the model's order
    unexpected: list[str]  # checkpoint keys


def transformers_model(model: nn.Module) -> Any:
    """The model if `transformers` made it (never imports transformers), else None."""
    transformers = sys.modules.get("transformers")
    if transformers is not None and isinstance(model, transformers.PreTrainedModel):
        return model
    return None


def map_names(model: nn.Module, keys: Iterable[str], targets: dict[str, torch.Tensor]) -> Names:
    """Each model tensor of `targets` (its state_dict) mapped to checkpoint `keys`."""
    hf = transformers_model(model)
    if hf is None:
        keys = set(keys)
        sources: dict[str, Source] = {name: Renamed(name) for name in targets if name in keys}
        return Names(sources, [n for n in targets if n not in keys],
                     sorted(keys - set(targets)))  # fmt: skip
    return _map_hf_names(hf, keys, targets)


def _map_hf_names(model: Any, keys: Iterable[str], targets: dict[str, torch.Tensor]) -> Names:
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import (
        WeightConverter,
        WeightRenaming,
        dot_natural_key,
        rename_source_key,
    )

    mapping = get_model_conversion_mapping(model, None, None)
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    by_pattern = {pattern: c for c in converters for pattern in c.source_patterns}
    prefix = model.base_model_prefix
    sources: dict[str, Source] = {}
    groups: dict[str, Converted] = {}
    unexpected = []
    for key in sorted(keys, key=dot_natural_key):
        renamed, pattern = rename_source_key(key, renamings, converters, prefix, targets)
        if renamed not in targets and key in targets:  # a key that needs no renaming
            renamed, pattern = rename_source_key(key, [], [], prefix, targets)
        if renamed not in targets:
            unexpected.append(key)
        elif pattern is not None:
            group = groups.setdefault(renamed, Converted(renamed, deepcopy(by_pattern[pattern])))
            group.sources.setdefault(pattern, []).append(key)
        else:
            sources.setdefault(renamed, Renamed(key))
    return _finish(model, targets, sources, groups, unexpected)


def _finish(
    model: Any,
    targets: dict[str, torch.Tensor],
    sources: dict[str, Source],
    groups: dict[str, Converted],
    unexpected: list[str],
) -> Names:
    from transformers.core_model_loading import Concatenate, MergeModulelist

    for group in groups.values():
        operations = group.converter.operations
        group.per_expert = (
            isinstance(operations[0], MergeModulelist) and operations[0].dim == 0
            and all(isinstance(op, Concatenate) and op.dim > 0 for op in operations[1:])
            and len({len(keys) for keys in group.sources.values()}) == 1
        )  # fmt: skip
        for name in target_names(group):
            if name in targets:
                sources.setdefault(name, group)
    # Tied tensors: all share the values of the one the checkpoint has (the source first).
    tied: dict[str, list[str]] = defaultdict(list)
    for target, source in getattr(model, "all_tied_weights_keys", {}).items():
        tied[source].append(target)
    for source, tied_targets in tied.items():
        present = [n for n in (source, *tied_targets) if n in sources]
        if present and isinstance(sources[present[0]], Renamed | Converted):
            for name in (source, *tied_targets):
                sources.setdefault(name, Tied(present[0]))
    info = SimpleNamespace(missing_keys={n for n in targets if n not in sources},
                           unexpected_keys=set(unexpected))  # fmt: skip
    model._adjust_missing_and_unexpected_keys(info)  # the model's own ignore patterns
    return Names(
        sources,
        [n for n in targets if n in info.missing_keys],
        [k for k in unexpected if k in info.unexpected_keys],
    )


def target_names(group: Converted) -> list[str]:
    """The model names a group makes: the first target's name with each target pattern."""
    patterns = group.converter.target_patterns
    return [group.first.replace(patterns[0], pattern, 1) for pattern in patterns]


def convert(
    group: Converted, tensors: dict[str, list[torch.Tensor]], config: Any
) -> dict[str, torch.Tensor]:
    """Run the group's converter on `tensors` (its sources by pattern); its targets by name."""
    converter = deepcopy(group.converter)
    for pattern, values in tensors.items():
        for value in values:
            converter.add_tensor(group.first, "", pattern, lambda value=value: value)
    made = converter.convert(group.first, config=config)
    return {name: value[0] if isinstance(value, list) else value for name, value in made.items()}


def converted_shapes(
    group: Converted, shapes: dict[str, tuple[tuple[int, ...], torch.dtype]], config: Any
) -> dict[str, tuple[int, ...]] | None:
    """The shapes a group makes from its sources' (shape, dtype) by key, run on the meta
    device; None where its operations cannot run there."""
    tensors = {pattern: [torch.empty(shapes[k][0], dtype=shapes[k][1], device="meta")
                         for k in keys] for pattern, keys in group.sources.items()}  # fmt: skip
    try:
        made = convert(group, tensors, config)
    except (RuntimeError, ValueError, TypeError, NotImplementedError, IndexError):
        return None
    return {name: tuple(value.shape) for name, value in made.items()}
