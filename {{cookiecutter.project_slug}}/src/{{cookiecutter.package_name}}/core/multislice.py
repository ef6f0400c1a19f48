"""Multislice: several TPU slices in one job, their runtimes meeting over the data-center network.

The TPU runtime (libtpu) of every worker of every slice reads four variables to join the
slices (the MegaScale runtime, "DCN"): the address of worker 0 of slice 0, which
coordinates them, the port the slices talk on, how many slices there are, and which one
this worker belongs to. The pod launcher sets them (`multislice_environment`); the
training code reads the slice count and this slice's index back (`slice_count`,
`slice_index`) to lay its mesh over the slices. Without them a job is one slice.

Which generations form a multislice is a column of the TPU table (`multislice`).
"""

from __future__ import annotations

import os
import re

from . import tpu_generations

COORDINATOR_ADDRESS = "MEGASCALE_COORDINATOR_ADDRESS"
NUM_SLICES = "MEGASCALE_NUM_SLICES"
SLICE_ID = "MEGASCALE_SLICE_ID"
PORT = "MEGASCALE_PORT"
# The port Ray (`ray.util.tpu`) and GKE's TPU webhook for KubeRay give the slices.
DEFAULT_PORT = 8081
# The backends that lay a device mesh over several slices (torch_xla's hybrid mesh). On
# another, the slices of one job would each train on their own, every one writing the same
# checkpoints: several slices are refused before anything is created or started.
MESH_OVER_SLICES = ("torch_xla",)


class MultisliceError(ValueError):
    """A slice count the accelerator type cannot form, or a broken multislice environment."""


def parse_slice_count(text: str) -> int:
    """A slice count from the command line: a whole number, at least 1."""
    if not re.fullmatch(r"[1-9][0-9]*", text):
        raise MultisliceError(
            f"slice count {text!r} is not a whole number of at least 1: "
            "pass --slices N (make: SLICES=N)"
        )
    return int(text)


def check_slices(accelerator_type: str, slices: int) -> None:
    """Refuse more than one slice on a backend that lays no mesh over slices, or of a
    generation Cloud TPU cannot join into a multislice (`accelerator_type` "": unchecked)."""
    if slices < 1:
        raise MultisliceError(f"slice count {slices} is not a whole number of at least 1")
    if slices == 1:
        return
    backend = tpu_generations.BACKEND
    if backend not in MESH_OVER_SLICES:
        raise MultisliceError(
            f"{slices} slices: the {backend} backend lays no device mesh over slices (each "
            "slice would train on its own); train on one slice (SLICES=1), or bake a "
            f"{' or '.join(MESH_OVER_SLICES)} project for a multislice"
        )
    if not accelerator_type:
        return
    try:
        generation, _ = tpu_generations.parse(accelerator_type)
    except tpu_generations.UnknownAcceleratorType as error:
        raise MultisliceError(str(error)) from None
    if not generation.multislice:
        able = [key for key, g in tpu_generations.generations().items() if g.multislice]
        raise MultisliceError(
            f"{slices} slices of {accelerator_type}: Cloud TPU forms a multislice only of "
            f"{', '.join(able)} slices, not {generation.name}; use one slice, or a "
            "generation that forms a multislice"
        )


def multislice_environment(
    coordinator: str, slices: int, slice_id: int, port: int = DEFAULT_PORT
) -> dict[str, str]:
    """What the runtime of a worker of slice `slice_id` reads to meet the other slices.

    `coordinator` is the address of worker 0 of slice 0, without a port.
    """
    return {
        COORDINATOR_ADDRESS: f"{coordinator}:{port}",
        NUM_SLICES: str(slices),
        SLICE_ID: str(slice_id),
        PORT: str(port),
    }


def _whole(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit():
        raise MultisliceError(f"{name}={value!r} is not a whole number: unset it or fix it")
    return int(value)


def slice_count() -> int:
    """How many slices this job spans: MEGASCALE_NUM_SLICES, 1 without it."""
    count = _whole(NUM_SLICES, 1)
    if count < 1:
        raise MultisliceError(f"{NUM_SLICES}={count} is not a slice count: unset it or fix it")
    return count


def slice_index() -> int:
    """This worker's slice, 0 to slice_count() - 1: MEGASCALE_SLICE_ID, 0 without it."""
    index, count = _whole(SLICE_ID, 0), slice_count()
    if index >= count:
        raise MultisliceError(
            f"{SLICE_ID}={index} is not below {NUM_SLICES}={count}: the launcher set them apart"
        )
    return index
