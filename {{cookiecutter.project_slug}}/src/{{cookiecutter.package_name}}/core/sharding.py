"""Sharding by rules: parameter name patterns -> partition specs over named mesh axes.

A mesh names its axes `data` (replicas of the model, each on its share of the batch),
`fsdp` (parameters, gradients and optimizer state split, gathered for use), `context` (each
sequence split: every device holds its stretch of the tokens' activations, attention
gathering what it must), `expert` (a mixture of experts' experts split for good, each device
holding its experts; the batch is split over it too) and `tensor` (matrices split for good:
each device computes its slice of every layer), outermost first: `fsdp=4,tensor=2` is 8
devices, `context=4,fsdp=2` too. A rule says how a parameter
is laid out over them: one entry per dimension, an axis, several axes, or None (whole).
`blocks.*.attn.qkv.weight -> ("tensor", "fsdp")` splits the rows over `tensor` and the
columns over `fsdp`. Patterns match the end of a parameter's name, `*` standing for one
part (`layers.*.mlp.up_proj.weight`).
Parameters no rule names follow the fsdp rule (their largest dimension over `fsdp`, as
torch_xla's FSDPv2 lays them out), or stay whole on a mesh without `fsdp`. So do parameters
whose rule splits them over a model axis (`tensor`, `expert`) the mesh lacks: such a rule
describes a model-parallel layout, and what is left of it on an fsdp-only mesh (the columns
over `fsdp`, biases whole) gathers and reduces slower than FSDPv2's layout, for nothing.

Nothing here imports torch_xla: the `plan` command and the checks before launch use it too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .runtime import RuntimeConfigError

# Mesh axes this project shards over, outermost first. `tensor` is innermost: its
# collectives run every layer, so it belongs on the fastest links; `expert`'s (tokens to
# their experts and back) run every mixture-of-experts layer, next to it, and `context`'s
# (each attention layer's keys and values, or its heads) next to those.
AXES = ("data", "fsdp", "context", "expert", "tensor")
BATCH_AXES = ("data", "fsdp", "expert")  # a batch's first dimension is split over these
SEQUENCE_AXIS = "context"  # a batch's second dimension (its tokens) is split over this one
# Axes that split parameters for good: a split must be even, some rule must use them, and a
# rule naming one applies only on a mesh that has it.
MODEL_AXES = ("expert", "tensor")

MeshShape = tuple[tuple[str, int], ...]
Entry = str | tuple[str, ...] | None
Spec = tuple[Entry, ...]


def parse_mesh(text: str) -> MeshShape:
    """Parse `fsdp=8` or `data=2,fsdp=2,tensor=2` into ordered (axis, size) pairs."""
    pairs: list[tuple[str, int]] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        axis, sep, size = item.partition("=")
        axis = axis.strip()
        if not sep or not size.strip().isdigit() or int(size) < 1:
            raise RuntimeConfigError(
                f"mesh entry {item!r} must look like axis=size with a positive size "
                "(e.g. mesh='data=2,fsdp=4')"
            )
        if axis not in AXES:
            raise RuntimeConfigError(f"unknown mesh axis {axis!r}: the axes are {', '.join(AXES)}")
        if axis in dict(pairs):
            raise RuntimeConfigError(f"mesh axis {axis!r} is given twice")
        pairs.append((axis, int(size)))
    return tuple(sorted(pairs, key=lambda pair: AXES.index(pair[0])))


def mesh_text(shape: MeshShape) -> str:
    return ",".join(f"{axis}={size}" for axis, size in shape)


def mesh_devices(shape: MeshShape) -> int:
    return math.prod(size for _, size in shape)


def check_mesh_size(request: MeshShape, devices: int) -> None:
    """Refuse a requested mesh whose size is not the job's device count."""
    size = mesh_devices(request)
    if request and size != devices:
        raise RuntimeConfigError(
            f"mesh {mesh_text(request)!r} has {size} devices but the job has {devices}: "
            f"make the axis sizes multiply to {devices}"
        )


def over_slices(shape: MeshShape, slices: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The mesh split for several slices: (within a slice, across slices) sizes per axis.

    The slices meet over the data-center network (DCN), far slower than the chips' own
    links (ICI), so only the outermost axis crosses it: with `data=4,fsdp=8` over 2 slices
    each slice holds `data=2,fsdp=8`, and the two slices are the data axis's other factor
    of 2. Its collectives are one gradient reduction per step; fsdp's gathers and tensor's
    all-reduces stay inside a slice.
    """
    sizes = [size for _, size in shape]
    if slices == 1:
        return tuple(sizes), (1,) * len(sizes)
    axis, outer = shape[0]
    if outer % slices:
        raise RuntimeConfigError(
            f"mesh {mesh_text(shape)!r} over {slices} slices: its outermost axis {axis!r} "
            f"({outer}) must be a multiple of {slices}, the only axis that crosses the "
            f"data-center network (e.g. mesh 'data={slices},{mesh_text(shape)}')"
        )
    dcn = (slices,) + (1,) * (len(sizes) - 1)
    return (outer // slices, *sizes[1:]), dcn


@dataclass(frozen=True)
class Rule:
    """Parameters whose name ends like `pattern` are laid out as `spec`.

    `required`: a rule someone wrote must name a parameter (else it is a typo); rules
    derived from a model's own plan may name parts some variants lack (biases, q_norm).
    """

    pattern: str
    spec: Spec
    required: bool = True

    def matches(self, name: str) -> bool:
        wanted, parts = self.pattern.split("."), name.split(".")
        if len(wanted) > len(parts):
            return False
        tail = parts[len(parts) - len(wanted) :]
        return all(w == "*" or w == p for w, p in zip(wanted, tail, strict=True))

    def axes(self) -> set[str]:
        return {axis for entry in self.spec for axis in axes_of(entry)}

    def applies(self, mesh: Mapping[str, int]) -> bool:
        """False where the rule splits over a model axis this mesh does not have."""
        return all(mesh.get(axis, 1) > 1 for axis in self.axes() & set(MODEL_AXES))


def axes_of(entry: Entry) -> tuple[str, ...]:
    """The axes a spec entry names, outermost first (none for a whole dimension)."""
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def parse_rules(items: Iterable[Any], source: str) -> list[Rule]:
    """Rules from `[[pattern, [axis or null, ...]], ...]` (a config file or a task)."""
    rules = []
    for item in items:
        if isinstance(item, Rule):
            rules.append(item)
            continue
        if not (isinstance(item, Sequence) and len(item) == 2 and isinstance(item[0], str)):
            raise RuntimeConfigError(
                f"{source}: a rule is [pattern, [axis or null per dimension]], got {item!r}"
            )
        pattern, spec = item
        if not isinstance(spec, Sequence) or isinstance(spec, str):
            raise RuntimeConfigError(
                f"{source}: rule {pattern!r} needs a list of axes, one per dim"
            )
        entries: list[Entry] = []
        for entry in spec:
            if entry in (None, "", "-", "none", "null"):
                entries.append(None)
            elif isinstance(entry, str):
                entries.append(entry)
            else:
                entries.append(tuple(str(axis) for axis in entry))
        rules.append(Rule(pattern, tuple(entries)))
    for rule in rules:
        unknown = sorted(rule.axes() - set(AXES))
        if unknown:
            raise RuntimeConfigError(
                f"{source}: rule {rule.pattern!r} names unknown mesh axis {unknown[0]!r}: "
                f"the axes are {', '.join(AXES)}"
            )
    return rules


def fsdp_spec(shape: Sequence[int]) -> Spec:
    """FSDPv2's layout: the largest dimension over `fsdp` (scalars whole)."""
    if not shape:
        return ()
    spec: list[Entry] = [None] * len(shape)
    spec[list(shape).index(max(shape))] = "fsdp"
    return tuple(spec)


def on_mesh(spec: Spec, mesh: Mapping[str, int]) -> Spec:
    """The spec with axes the mesh lacks (or has at size 1) dropped."""
    entries: list[Entry] = []
    for entry in spec:
        kept = tuple(axis for axis in axes_of(entry) if mesh.get(axis, 1) > 1)
        entries.append(None if not kept else kept[0] if len(kept) == 1 else kept)
    return tuple(entries)


def layout(
    parameters: Mapping[str, Sequence[str]],
    shapes: Mapping[str, Sequence[int]],
    rules: Sequence[Rule],
    mesh: Mapping[str, int],
) -> dict[str, Spec]:
    """Each parameter's spec on `mesh`: the first rule naming it (by any of its names) if
    it applies on this mesh, else the fsdp rule where the mesh has `fsdp`, else whole.
    RuntimeConfigError names a rule that matches nothing, a rank mismatch, or a tensor
    axis that does not divide.

    `parameters` maps a parameter's first name to all its names (tied parameters have
    several), `shapes` that name to its shape.
    """
    used: set[int] = set()
    specs: dict[str, Spec] = {}
    for key, names in parameters.items():
        shape = tuple(shapes[key])
        found = next(
            ((i, r) for i, r in enumerate(rules) if any(r.matches(_plain(n)) for n in names)),
            None,
        )
        rule = None
        if found is not None:
            used.add(found[0])
            rule = found[1]
            if len(rule.spec) != len(shape):
                raise RuntimeConfigError(
                    f"rule {rule.pattern!r} gives {len(rule.spec)} dimension(s) but parameter "
                    f"{names[0]!r} has {len(shape)} (shape {list(shape)})"
                )
        if rule is not None and rule.applies(mesh):
            spec = rule.spec
        else:
            spec = fsdp_spec(shape) if mesh.get("fsdp", 1) > 1 else (None,) * len(shape)
        specs[key] = on_mesh(spec, mesh)
        _check_divides(names[0], shape, specs[key], mesh)
    unused = [r.pattern for i, r in enumerate(rules) if r.required and i not in used]
    if unused:
        raise RuntimeConfigError(
            f"sharding rule {unused[0]!r} matches no parameter of the model (names look like "
            f"{next(iter(parameters.values()))[0]!r})"
        )
    for axis in MODEL_AXES:
        size = mesh.get(axis, 1)
        if size > 1 and not any(axis in axes_of(e) for s in specs.values() for e in s):
            raise RuntimeConfigError(
                f"the mesh has {axis}={size} but no rule splits a parameter over it: "
                f"give sharding_rules that use {axis!r}, or drop the axis"
            )
    return specs


def model_layout(model: Any, rules: Sequence[Rule], mesh: Mapping[str, int]) -> dict[int, Spec]:
    """`layout` of a model's parameters, by id: a tied parameter once, under all its names."""
    names: dict[int, list[str]] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)  # a tied parameter has several
        shapes.setdefault(names[id(param)][0], tuple(param.shape))
    specs = layout({found[0]: found for found in names.values()}, shapes, rules, mesh)
    return {key: specs[found[0]] for key, found in names.items()}


def _plain(name: str) -> str:
    """A parameter's name as rules see it: without peft's `base_layer` inside a LoRA layer."""
    return name.replace(".base_layer.", ".")


def _check_divides(name: str, shape: Sequence[int], spec: Spec, mesh: Mapping[str, int]) -> None:
    """Refuse a tensor or expert split that cuts a dimension unevenly (fsdp pads; they
    must not)."""
    for dim, entry in enumerate(spec):
        for axis in set(axes_of(entry)) & set(MODEL_AXES):
            if shape[dim] % mesh[axis]:
                raise RuntimeConfigError(
                    f"{axis}={mesh[axis]} does not divide dimension {dim} ({shape[dim]}) of "
                    f"parameter {name!r}: choose a {axis} size that divides it"
                )


def state_spec(param_spec: Spec | None, param_shape: Sequence[int], shape: Sequence[int]) -> Spec:
    """An optimizer state tensor's layout: its parameter's when shaped like it (a moment),
    else whole (Adafactor's row and column factors, step counters)."""
    if param_spec is not None and tuple(shape) == tuple(param_shape):
        return param_spec
    return (None,) * len(shape)


def shard_shape(shape: Sequence[int], spec: Spec, mesh: Mapping[str, int]) -> tuple[int, ...]:
    """The block of a tensor one device holds: each dimension divided by the sizes of the
    axes that split it, rounded up (XLA pads the last shard)."""
    return tuple(
        -(-size // math.prod(mesh.get(axis, 1) for axis in axes_of(entry)))
        for size, entry in zip(shape, spec, strict=True)
    )


def spec_text(spec: Spec) -> str:
    """`(tensor, fsdp)` for reports."""
    return "(" + ", ".join("+".join(axes_of(e)) or "-" for e in spec) + ")"
