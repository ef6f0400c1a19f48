"""The keys a state is read under: the layout the checkpoint was written in, whichever backend
wrote it.

torch.distributed.checkpoint flattens a state into dotted keys, and its flatteners differ:
torch's own (the torch_tpu backend) splits every table down to its leaves
(`config.seed`, `optimizer.param_groups.0.lr`), torch_xla's CheckpointManager keeps a table
that holds no tensor as one object (`config`, `optimizer.param_groups`). Reading walks the
state to be filled along the keys the checkpoint holds, so either layout reads on either
backend, and hands DCP a state already flat, every object saved whole a `None` in its place:
its own flattener then has nothing to split.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import torch

# Where a flat key's value goes back: the table holding it and its name there.
Place = tuple[MutableMapping[str, Any] | list[Any], str | int]


def flatten(state: dict[str, Any], keys: set[str]) -> tuple[dict[str, Any], dict[str, Place]]:
    """`state`'s entries under the saved keys they are read from (`model.embed.weight`: the
    live tensor; `config`: None, the object read in its place), and where each goes back.

    A `None` entry whose key was saved split becomes, in `state`, the table those keys spell
    (its leaves `None`, each read whole). An entry the checkpoint lacks keeps its own key, for
    DCP to name as missing.
    """
    flat: dict[str, Any] = {}
    places: dict[str, Place] = {}

    def walk(table: MutableMapping[str, Any] | list[Any], prefix: str) -> None:
        names = list(table) if isinstance(table, MutableMapping) else list(range(len(table)))
        for name in names:
            value = table[name]  # type: ignore[index]
            key = f"{prefix}{name}"
            container = isinstance(value, MutableMapping | list)
            if key not in keys and container and not value:
                continue  # an empty table: torch's flattener writes no key for it either
            if key not in keys and not torch.is_tensor(value) and _split(key, keys):
                if value is None:
                    value = _table(key, keys)
                    table[name] = value  # type: ignore[index]
                if isinstance(value, MutableMapping | list):
                    walk(value, f"{key}.")
                    continue
            if key in keys and not torch.is_tensor(value):
                value = None  # an object read whole: a table here would be split by DCP's planner
            flat[key] = value  # or missing from the checkpoint, and DCP says so with its key
            places[key] = (table, name)

    walk(state, "")
    return flat, places


def unflatten(flat: Mapping[str, Any], places: Mapping[str, Place]) -> None:
    """Put what DCP read into `flat` back where `flatten` found each entry."""
    for key, value in flat.items():
        table, name = places[key]
        table[name] = value  # type: ignore[index]


def _split(key: str, keys: set[str]) -> bool:
    """True when the checkpoint holds `key` as a table split into its entries."""
    return any(saved.startswith(f"{key}.") for saved in keys)


def _table(key: str, keys: set[str]) -> dict[str, Any]:
    """The nested tables under `key` that the saved keys spell, their leaves None."""
    table: dict[str, Any] = {}
    for saved in keys:
        if not saved.startswith(f"{key}."):
            continue
        *path, leaf = saved[len(key) + 1 :].split(".")
        inner = table
        for part in path:
            inner = inner.setdefault(part, {})
        inner[leaf] = None
    return table
