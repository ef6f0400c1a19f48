"""Per-device bytes of a run on a mesh, and the smallest slice of a generation it fits.

Parameters, gradients and optimizer state are laid out as the run lays them out (the
sharding rules, `core/sharding.py`; optimizer state like its parameter), each shard rounded
up as XLA pads it: the same arithmetic `core/memory.py` applies to a live run's annotations.
Activations come from `activations.py`, recorded at 2 and 3 samples per device and extended
linearly (every activation is a per-sample tensor or a constant), so any batch costs no
further forward pass. A `context` axis splits every activation over its devices: each holds
its stretch of the tokens, and attention's keys and values (or heads) are split as much.
Attention is counted as TPU's flash kernel keeps it (no score matrix: `core/attention.py`).
One sample is recorded as such: with a batch of one, some reshapes
are views where larger batches copy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..core import tpu_generations
from ..core.memory import held_spec
from ..core.sharding import (
    BATCH_AXES,
    SEQUENCE_AXIS,
    MeshShape,
    Spec,
    shard_shape,
    state_spec,
)
from ..core.tpu_generations import Generation
from .activations import Recording, Saved, record
from .workload import StateTensor, Workload


class PlanError(ValueError):
    """A plan that cannot be made; the message says what to change."""


@dataclass(frozen=True)
class Accelerator:
    """A TPU slice: its generation, size, devices and the HBM of each device."""

    type: str
    generation: Generation
    size: int

    @classmethod
    def parse(cls, text: str) -> Accelerator:
        name = tpu_generations.canonical(text)
        generation, size = tpu_generations.parse(name)  # UnknownAcceleratorType names the fix
        return cls(name, generation, size)

    @property
    def devices(self) -> int:
        return self.generation.devices(self.size)

    @property
    def hbm_bytes_per_device(self) -> int:
        return self.generation.hbm_bytes_per_device


@dataclass(frozen=True)
class BatchSize:
    """The batch as `train` takes it: per device of the data axes (data, fsdp, expert; the
    devices of a `tensor` or `context` group share their samples), or global; and
    evaluation's per device (None: the training batch's)."""

    per_device: int | None = None
    global_batch: int | None = None
    eval_per_device: int | None = None

    def of(self, mesh: MeshShape) -> int:
        return self.global_batch or (self.per_device or 1) * batch_shards(mesh)

    def eval_of(self, mesh: MeshShape) -> int:
        """Evaluation's global batch: its batch_size per batch shard, else the training's."""
        if self.eval_per_device:
            return self.eval_per_device * batch_shards(mesh)
        return self.of(mesh)


def batch_shards(mesh: MeshShape) -> int:
    """How many ways a batch is split: the product of the mesh's batch axes."""
    return math.prod(size for axis, size in mesh if axis in BATCH_AXES)


@dataclass(frozen=True)
class Estimate:
    """Bytes on each device for one mesh (the fullest device: shards rounded up)."""

    mesh: MeshShape
    global_batch: int
    samples_per_shard: int  # the samples each device works on: global / the batch axes
    parameters: int
    gradients: int
    optimizer: int
    gathered: int  # fsdp: one block's weights gathered whole, and their gradients
    activations: int
    activations_checkpointed: int
    eval_samples_per_shard: int = 0
    # Evaluation's forward pass, without gradients: what lives outside the blocks and one
    # block at a time, at the eval batch (it runs after a step, when no activation is kept).
    eval_activations: int = 0
    reference: int = 0  # DPO without LoRA: the policy's frozen copy, laid out as it is

    def peak_activations(self, checkpointed: bool) -> int:
        """The larger of a training step's activations and an evaluation's."""
        training = self.activations_checkpointed if checkpointed else self.activations
        return max(training, self.eval_activations)

    def total(self, checkpointed: bool) -> int:
        state = self.parameters + self.gradients + self.optimizer + self.gathered + self.reference
        return state + self.peak_activations(checkpointed)


def check_mesh(mesh: MeshShape, accelerator: Accelerator) -> None:
    """Refuse a mesh that is not the slice's devices: every axis divides them, the axes
    multiply to them."""
    devices = accelerator.devices
    for axis, size in mesh:
        if devices % size:
            raise PlanError(
                f"mesh axis {axis}={size} does not divide the {devices} devices of "
                f"{accelerator.type}: choose axis sizes that divide {devices}"
            )
    if math.prod(size for _, size in mesh) != devices:
        text = ",".join(f"{axis}={size}" for axis, size in mesh)
        raise PlanError(
            f"mesh {text!r} has {math.prod(s for _, s in mesh)} devices but {accelerator.type} "
            f"has {devices}: make the axis sizes multiply to {devices}"
        )


def check_batch(mesh: MeshShape, global_batch: int) -> int:
    """The samples on each device: the batch split over the batch axes (data, fsdp, expert)."""
    shards = batch_shards(mesh)
    if global_batch % shards:
        raise PlanError(
            f"a global batch of {global_batch} does not split into the {shards} batch shards "
            "(data x fsdp x expert) of the mesh: choose a batch that does"
        )
    return global_batch // shards


class Planner:
    """Estimates for one workload on any mesh; forward passes are recorded once per way the
    tensor axis splits the model."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.state = workload.optimizer_state()
        self.autocast = workload.config.precision == "bf16-mixed"
        self._recordings: dict[tuple[frozenset[tuple[int, bool]], int], Recording] = {}
        # Each layout's estimate, or why it has none: the searches for both ways to train
        # and for the asked slice try the same layouts.
        self._estimates: dict[tuple[MeshShape, BatchSize], Estimate | ValueError] = {}

    def estimate(self, mesh: MeshShape, batch: BatchSize) -> Estimate:
        """Per-device bytes on `mesh` (RuntimeConfigError or ValueError: the mesh does not
        suit the model; PlanError: the batch does not split over it)."""
        key = (mesh, batch)
        if key not in self._estimates:
            try:
                self._estimates[key] = self._estimate(mesh, batch)
            except ValueError as error:
                self._estimates[key] = error
        found = self._estimates[key]
        if isinstance(found, ValueError):
            raise found
        return found

    def _estimate(self, mesh: MeshShape, batch: BatchSize) -> Estimate:
        global_batch = batch.of(mesh)
        axes = dict(mesh)
        specs = self.workload.rules_layout(axes)
        params = self.workload.parameters
        # As the backend holds them; a model without repeated blocks: the rules everywhere.
        in_blocks = self.workload.in_blocks
        held_specs = [held_spec(spec, axes, not in_blocks or i in in_blocks)
                      for i, spec in enumerate(specs)]  # fmt: skip

        def held(index: int, itemsize: int) -> int:  # bytes of parameter `index` per device
            return math.prod(shard_shape(params[index].shape, held_specs[index], axes)) * itemsize

        def state_held(state: StateTensor) -> int:  # laid out like its parameter, or whole
            parameter = state.parameter
            spec = state_spec(held_specs[parameter], params[parameter].shape, state.shape)
            return math.prod(shard_shape(state.shape, spec, axes)) * state.itemsize

        weights = [held(i, p.itemsize) for i, p in enumerate(params)]
        optimizer = sum(map(state_held, self.state))
        samples = check_batch(mesh, global_batch)
        first, second = self._recorded(specs, samples)
        tensor, context = axes.get("tensor", 1), axes.get(SEQUENCE_AXIS, 1)

        def at(one: Saved, two: Saved) -> int:
            return _per_device(one, two, samples, tensor, held, context)

        recomputed = (at(one, two) for one, two in zip(first.blocks, second.blocks, strict=True))
        eval_samples = check_batch(mesh, batch.eval_of(mesh))
        return Estimate(
            mesh=mesh,
            global_batch=global_batch,
            samples_per_shard=samples,
            parameters=sum(weights),
            gradients=sum(w for w, p in zip(weights, params, strict=True) if p.trainable),
            optimizer=optimizer,
            gathered=self._gathered(specs, axes),
            activations=at(first.kept, second.kept),
            # Without repeated blocks there is nothing to recompute: checkpointing is refused.
            activations_checkpointed=at(first.outside, second.outside)
            + at(first.block_inputs, second.block_inputs)
            + max(recomputed, default=0)
            if first.blocks
            else at(first.kept, second.kept),
            eval_samples_per_shard=eval_samples,
            eval_activations=self._eval_activations(specs, eval_samples, tensor, held, context),
            reference=sum(weights) if self.workload.reference_copy else 0,
        )

    def _eval_activations(
        self, specs: list[Spec], samples: int, tensor: int, held: Callable[[int, int], int],
        context: int,
    ) -> int:  # fmt: skip
        """Bytes of an evaluation forward at `samples` per device: without autograd nothing
        is kept for a backward pass, so what lives outside the blocks plus the largest
        block's working set (what training with checkpointing recomputes), at once."""
        first, second = self._recorded(specs, samples)

        def at(one: Saved, two: Saved) -> int:
            return _per_device(one, two, samples, tensor, held, context)

        if not first.blocks:
            return at(first.kept, second.kept)
        blocks = (at(one, two) for one, two in zip(first.blocks, second.blocks, strict=True))
        return at(first.outside, second.outside) + max(blocks)

    def _recorded(self, specs: list[Spec], samples: int) -> tuple[Recording, Recording]:
        """Two recordings to extend linearly to `samples` (the same one twice for one sample),
        for the way these layouts split the model over the tensor axis."""
        split = frozenset(
            (i, "tensor" in _axes(spec[0]))
            for i, spec in enumerate(specs)
            if any("tensor" in _axes(entry) for entry in spec)
        )
        points = (1, 1) if samples == 1 else (2, 3)
        for point in set(points):
            if (split, point) not in self._recordings:
                self._recordings[(split, point)] = record(
                    self.workload, point, dict(split), self.autocast
                )
        return self._recordings[(split, points[0])], self._recordings[(split, points[1])]

    def _gathered(self, specs: list[Spec], axes: Mapping[str, int]) -> int:
        """FSDP gathers a block's weights whole over `fsdp` to use them, and its gradients
        exist whole until they are reduce-scattered: the largest block (or parameter outside
        the blocks) costs that much more while it runs."""
        if axes.get("fsdp", 1) == 1:
            return 0
        whole = {**axes, "fsdp": 1}
        params = self.workload.parameters
        in_blocks = self.workload.in_blocks
        units = [*self.workload.block_parameters,
                 *({i} for i in range(len(params)) if i not in in_blocks)]  # fmt: skip

        def cost(unit: set[int]) -> int:
            return sum(
                math.prod(shard_shape(params[i].shape, specs[i], whole))
                * params[i].itemsize
                * (2 if params[i].trainable else 1)
                for i in unit
            )

        return max(map(cost, units), default=0)

    def smallest(
        self, generation: Generation, batch: BatchSize, checkpointed: bool, usable: float
    ) -> tuple[str, Estimate] | None:
        """The fewest devices of `generation` this run fits, and the layout that fits there
        (`fitting`)."""
        for size in generation.slice_sizes:
            found = self.fitting(generation, size, batch, checkpointed, usable)
            if found is not None:
                return f"{generation.key}-{size}", found
        return None

    def fitting(
        self, generation: Generation, size: int, batch: BatchSize, checkpointed: bool,
        usable: float,
    ) -> Estimate | None:  # fmt: skip
        """The first layout of a slice this run fits on: fsdp over every device, else the
        smallest tensor axis within a host, else the smallest context axis (for sequences
        whose activations one device cannot hold) with either. A data axis only adds copies
        of the state, never saves memory."""
        devices = generation.devices(size)
        if self._state_bytes() > usable * devices:  # no layout holds less than its share
            return None
        per_host = generation.devices_per_host(size)
        contexts = [c for c in (1, 2, 4, 8, 16, 32, 64) if devices % c == 0]
        for context in contexts:
            for tensor in (
                t for t in (1, 2, 4, 8) if t <= per_host and devices % (t * context) == 0
            ):
                mesh: MeshShape = (("fsdp", devices // (tensor * context)),)
                mesh += ((SEQUENCE_AXIS, context),) if context > 1 else ()
                mesh += (("tensor", tensor),) if tensor > 1 else ()
                mesh = tuple((axis, n) for axis, n in mesh if n > 1) or (("fsdp", 1),)
                try:
                    estimate = self.estimate(mesh, batch)
                except ValueError:  # the model or the batch does not split this way
                    continue
                if estimate.total(checkpointed) <= usable:
                    return estimate
        return None

    def _state_bytes(self) -> int:
        """Parameters, gradients and optimizer state over all devices: each device holds at
        least its share of them, whatever the layout."""
        params = self.workload.parameters
        weights = sum(math.prod(p.shape) * p.itemsize for p in params)
        gradients = sum(math.prod(p.shape) * p.itemsize for p in params if p.trainable)
        return weights + gradients + sum(math.prod(t.shape) * t.itemsize for t in self.state)


def _axes(entry: str | tuple[str, ...] | None) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else entry


def _per_device(
    one: Saved, two: Saved, samples: int, tensor: int, held: Callable[[int, int], int],
    context: int = 1,
) -> int:  # fmt: skip
    """Bytes per device at `samples` samples, from recordings of 2 and 3 samples (or, given
    the same recording twice, from that one); `context` splits every activation."""
    whole, split = one.whole, one.split
    if two is not one:
        whole += (two.whole - one.whole) * (samples - 2)
        split += (two.split - one.split) * (samples - 2)
    copies = sum(held(index, itemsize) for index, itemsize in one.copies)
    return -(-whole // context) + -(-split // (tensor * context)) + copies
