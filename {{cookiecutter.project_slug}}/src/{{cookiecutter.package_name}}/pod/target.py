"""The TPU a pod command reaches: its name, zone and project, and the gcloud that reaches it."""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..core.runtime import RuntimeConfigError, topology


class PodError(ValueError):
    """Bad input or setup for a pod command; the message says what to do."""


@dataclass(frozen=True)
class Target:
    """A TPU VM (or pod slice) and the gcloud that reaches it."""

    name: str
    zone: str
    project: str = ""
    gcloud: tuple[str, ...] = ("gcloud",)

    def _base(self, verb: str) -> list[str]:
        scope = ["--zone", self.zone, *(["--project", self.project] if self.project else [])]
        return [*self.gcloud, "compute", "tpus", "tpu-vm", verb, self.name, *scope]

    def ssh(self, worker: int | str, command: str) -> list[str]:
        return [*self._base("ssh"), f"--worker={worker}", "--command", command]

    def scp(self, worker: int | str, sources: Sequence[str], destination: str) -> list[str]:
        scope = ["--zone", self.zone, *(["--project", self.project] if self.project else [])]
        base = [*self.gcloud, "compute", "tpus", "tpu-vm", "scp", "--recurse", *sources]
        return [*base, f"{self.name}:{destination}", *scope, f"--worker={worker}"]

    def describe(self) -> list[str]:
        return [*self._base("describe"), "--format=json"]


def make_target(name: str | None, zone: str, project: str, gcloud: str) -> Target:
    """Validate the launcher's settings into a Target."""
    if not name:
        raise PodError("no TPU name: pass --tpu NAME (make: TPU_NAME=...)")
    if not zone:
        raise PodError("no zone: pass --zone ZONE (make: ZONE=...)")
    command = tuple(shlex.split(gcloud))
    if not command:
        raise PodError("empty gcloud command: pass --gcloud or set GCLOUD")
    return Target(name=name, zone=zone, project=project, gcloud=command)


Describe = Callable[[list[str]], subprocess.CompletedProcess[str]]


def _describe(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as error:
        return subprocess.CompletedProcess(argv, 127, "", str(error))


def endpoints(target: Target, describe: Describe | None = None) -> tuple[list[str], str]:
    """The workers' addresses from `describe` (networkEndpoints), or none and the reason."""
    result = (describe or _describe)(target.describe())
    if result.returncode == 0:
        try:
            found = json.loads(result.stdout).get("networkEndpoints", [])
            addresses = [str(endpoint.get("ipAddress", "")) for endpoint in found]
        except (json.JSONDecodeError, AttributeError):
            addresses = []
        if addresses:
            return addresses, ""
    lines = result.stderr.strip().splitlines()
    return [], next((line for line in lines if line.startswith("ERROR")), "no networkEndpoints")


def describe_workers(
    target: Target, accelerator_type: str = "", describe: Describe | None = None
) -> tuple[int, list[str]]:
    """The TPU's worker count and addresses from `describe`, else the count its type gives."""
    addresses, reason = endpoints(target, describe)
    if addresses:
        return len(addresses), addresses
    if accelerator_type:
        try:
            return topology(accelerator_type).hosts, []
        except RuntimeConfigError as error:
            raise PodError(str(error)) from None
    raise PodError(
        f"unknown worker count for TPU {target.name!r} ({reason}): "
        "pass --workers N or --accelerator-type TYPE"
    )


def worker_count(
    target: Target, accelerator_type: str = "", describe: Describe | None = None
) -> int:
    """Workers of the TPU from `describe` (networkEndpoints), else from the accelerator type."""
    return describe_workers(target, accelerator_type, describe)[0]
