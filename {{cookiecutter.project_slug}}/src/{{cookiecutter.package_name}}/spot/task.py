"""The SkyPilot task of a spot run, checked before a line of it is written.

SkyPilot runs a task's `setup` and then its `run` on every host of the TPU slice, from
`~/sky_workdir`, where the task's relative file mounts land. The task mounts the files
`pod sync` copies into REMOTE_DIR there, so `run` is, character for character, the line
`pod train` sends each worker over ssh. SkyPilot's own parser accepts TPU types that do
not exist (its catalog is read at launch, in the cloud): the TPU table refuses them here.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..cli_common import EXIT_PREEMPTED
from ..core.multislice import MultisliceError, parse_slice_count
from ..core.tpu_generations import UnknownAcceleratorType, canonical, generations, parse
from ..pod import commands
from ..pod.defaults import STARTUP_SCRIPT

# SkyPilot's default: a region that preempted a slice is likely to preempt the next one, so
# the slice is recreated in the next zone or region of the list first.
RECOVERY_STRATEGY = "EAGER_NEXT_REGION"
# What a spot host installs beside the project: gcsfs for the gs:// checkpoints, and
# ml-goodput-measurement for the goodput account at the end of every attempt.
INSTALL_EXTRAS = ("gcs", "goodput")
_ZONE = re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z]")
_REGION = re.compile(r"[a-z]+-[a-z]+[0-9]+")


class SpotError(ValueError):
    """A spot run that cannot be described; the message says what to change."""


@dataclass(frozen=True)
class SpotRequest:
    """What a spot run asks for, before anything is checked."""

    name: str
    accelerator_type: str
    runtime_version: str
    zones: tuple[str, ...]
    spot: bool
    slices: str
    max_restarts_on_errors: int
    checkpoint_dir: str


def tpu_accelerator(accelerator_type: str) -> str:
    """SkyPilot's name of a TPU slice (`tpu-v5p-64`), from the project's table of generations."""
    try:
        parse(canonical(accelerator_type))
    except UnknownAcceleratorType as error:
        raise SpotError(str(error)) from None
    return f"tpu-{canonical(accelerator_type)}"


def check_runtime(accelerator_type: str, runtime_version: str) -> None:
    """Refuse a runtime the TPU table gives another generation and not this one (a slice of
    the wrong runtime fails to boot, in the cloud, after the wait for capacity)."""
    generation, _ = parse(canonical(accelerator_type))
    if runtime_version in generation.runtime_versions:
        return
    others = [g.key for g in generations().values() if runtime_version in g.runtime_versions]
    if others:
        raise SpotError(
            f"runtime {runtime_version!r} is {others[0]}'s, not {generation.key}'s: set "
            f"RUNTIME_VERSION={generation.runtime_versions[0]} (make) or --runtime-version"
        )


def checkpoint_location(url: str) -> str:
    """The run's checkpoint directory: a gs:// URL, since the VM and its disk do not last."""
    if not url.startswith("gs://") or not url[5:].strip("/"):
        given = repr(url) if url else "none"
        raise SpotError(
            f"a spot run keeps its checkpoints on gs://, got {given}: a preempted VM takes its "
            "disk with it; pass --checkpoint-dir gs://BUCKET/PATH (make: CHECKPOINT_DIR=...)"
        )
    return url.rstrip("/")


def infra(place: str) -> str:
    """SkyPilot's `infra` of a zone (`gcp/us-east5/us-east5-a`) or a region (`gcp/us-east5`)."""
    if _ZONE.fullmatch(place):
        return f"gcp/{place.rsplit('-', 1)[0]}/{place}"
    if _REGION.fullmatch(place):
        return f"gcp/{place}"
    raise SpotError(f"{place!r} is neither a zone (us-east5-a) nor a region (us-east5)")


def one_slice(slices: str) -> None:
    """Refuse several slices: SkyPilot makes each TPU VM on its own, never a multislice."""
    try:
        count = parse_slice_count(slices)
    except MultisliceError as error:
        raise SpotError(str(error)) from None
    if count > 1:
        raise SpotError(
            f"SLICES={count}: SkyPilot 0.14 creates each TPU slice as a TPU VM of its own, not "
            "as one queued resource of several nodes, which Cloud TPU's multislice needs; a spot "
            "run trains on one slice (SLICES=1). Several slices: make tpu-create SLICES=N"
        )


def training_args(args: Sequence[str], checkpoint_dir: str) -> list[str]:
    """The `train` arguments of every attempt: the given ones, then the checkpoint directory."""
    if any(arg == "--checkpoint-dir" or arg.startswith("--checkpoint-dir=") for arg in args):
        raise SpotError(
            "give the checkpoint directory once, as --checkpoint-dir of `spot task` "
            "(make: CHECKPOINT_DIR), not among the training arguments"
        )
    return [*args, "--checkpoint-dir", checkpoint_dir]


def setup_command(python: str, remote_dir: str) -> str:
    """What each host runs once: the TPU VM startup script (torch, torch_xla[tpu], the
    compile cache), with its log on the task's output, then the project, as `pod sync`
    installs it, with INSTALL_EXTRAS."""
    startup = "sudo env LOG=/dev/stdout bash " + shlex.quote(f"{remote_dir}/{STARTUP_SCRIPT}")
    install = commands.install_command(python, INSTALL_EXTRAS)
    return f"{startup}\n{commands.remote_command(install, {}, remote_dir)}\n"


def task_spec(request: SpotRequest, run: str, setup: str, mounts: dict[str, str]) -> dict[str, Any]:
    """The task as SkyPilot's YAML holds it: resources, recovery, files, setup and run."""
    tpu = tpu_accelerator(request.accelerator_type)
    check_runtime(request.accelerator_type, request.runtime_version)
    one_slice(request.slices)
    if request.max_restarts_on_errors < 0:
        raise SpotError(
            f"max_restarts_on_errors must be 0 or more, got {request.max_restarts_on_errors}"
        )
    if not request.zones:
        raise SpotError("no zone: pass --zone ZONE (repeat it for a list to fail over to)")
    places = [{"infra": infra(place)} for place in request.zones]
    resources: dict[str, Any] = {
        "accelerators": tpu,
        "accelerator_args": {"runtime_version": request.runtime_version, "tpu_vm": True},
        "use_spot": request.spot,
        **(places[0] if len(places) == 1 else {"any_of": places}),
        # A preempted attempt exits EXIT_PREEMPTED after saving: recovered like a lost VM,
        # not counted among the errors (SkyPilot counts any other non-zero exit of a host
        # whose slice is still up).
        "job_recovery": {
            "strategy": RECOVERY_STRATEGY,
            "max_restarts_on_errors": request.max_restarts_on_errors,
            "recover_on_exit_codes": [EXIT_PREEMPTED],
        },
    }
    return {
        "name": request.name,
        "resources": resources,
        "file_mounts": mounts,
        "setup": setup,
        "run": run,
    }
