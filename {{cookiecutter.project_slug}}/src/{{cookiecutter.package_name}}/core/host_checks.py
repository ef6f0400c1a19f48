"""Checks of the host that every backend's `doctor` runs: who holds the TPU, the container,
shared memory; a check's shape and the report."""

from __future__ import annotations

import glob
import importlib.metadata
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DEVICE_PATTERNS = ("/dev/accel*", "/dev/vfio/[0-9]*")
MIN_SHM_BYTES = 1 << 30
# XRT left torch_xla in 2.1; these only confuse a PJRT runtime.
XRT_VARIABLES = ("XRT_TPU_CONFIG", "XRT_MESH_SERVICE_ADDRESS", "XRT_WORKERS", "XRT_DEVICE_MAP")


@dataclass(frozen=True)
class Check:
    """One finding: `ok`, `warn` or `error`, what was seen, and the fix for a problem."""

    name: str
    status: str
    detail: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def major_minor(version: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


def device_holders(
    patterns: Sequence[str] = DEVICE_PATTERNS, proc: str = "/proc"
) -> dict[int, list[str]]:
    """PIDs (other than this one) with a TPU device file open, and the files they hold."""
    devices = {path for pattern in patterns for path in glob.glob(pattern)}
    holders: dict[int, list[str]] = {}
    if not devices:
        return holders
    for fd in glob.glob(f"{proc}/[0-9]*/fd/*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        pid = int(fd.split("/")[-3])
        if target in devices and pid != os.getpid():
            holders.setdefault(pid, []).append(target)
    return holders


def check_holders(holders: Mapping[int, Sequence[str]]) -> Check:
    if not holders:
        return Check("tpu-holders", "ok", "no other process holds a TPU device file")
    listed = ", ".join(f"{pid} ({', '.join(sorted(set(files)))})" for pid, files in holders.items())
    pids = " ".join(map(str, holders))
    return Check(
        "tpu-holders",
        "error",
        f"processes hold the TPU: {listed}",
        f"stop them: kill {pids} (on a pod: make pod-kill), then rm -f /tmp/libtpu_lockfile",
    )


def in_container() -> bool:
    if Path("/.dockerenv").exists():
        return True
    try:
        cgroup = Path("/proc/1/cgroup").read_text()
    except OSError:
        return False
    return any(word in cgroup for word in ("docker", "containerd", "kubepods", "libpod"))


def capabilities_full(status_text: str, last_cap: int) -> bool:
    """Whether CapEff holds every capability (what `docker run --privileged` grants)."""
    match = re.search(r"^CapEff:\s*([0-9a-fA-F]+)", status_text, re.MULTILINE)
    return match is not None and int(match[1], 16) == (1 << (last_cap + 1)) - 1


def check_container() -> list[Check]:
    """Inside Docker: the TPU needs --privileged, --net=host and a big /dev/shm."""
    if not in_container():
        return [Check("container", "ok", "not inside a container")]
    checks = []
    try:
        status_text = Path("/proc/self/status").read_text()
        last_cap = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
        privileged = capabilities_full(status_text, last_cap)
    except (OSError, ValueError):
        privileged = False
    checks.append(
        Check("container", "ok", "inside a container, privileged")
        if privileged
        else Check(
            "container",
            "warn",
            "inside a container without full privileges: the TPU devices may be unreachable",
            "docker run --privileged --net=host --shm-size=16G ...",
        )
    )
    interfaces = [line.split(":")[0].strip() for line in _read_lines("/proc/net/dev")[2:]]
    own_network = set(interfaces) <= {"lo", "eth0"}
    checks.append(
        Check(
            "container-network",
            "warn" if own_network else "ok",
            f"network interfaces: {', '.join(interfaces) or 'none'}"
            + (" (a container network)" if own_network else " (looks like the host's)"),
            "docker run --net=host: pod workers talk over the host network" if own_network else "",
        )
    )
    checks.append(check_shm())
    return checks


def check_shm(path: str = "/dev/shm") -> Check:
    try:
        stats = os.statvfs(path)
    except OSError:
        return Check("shm", "warn", f"{path} is missing", "docker run --shm-size=16G ...")
    size = stats.f_frsize * stats.f_blocks
    detail = f"{path} is {size / (1 << 30):.1f} GiB"
    if size < MIN_SHM_BYTES:
        return Check("shm", "warn", detail + " (data loader workers need more)", "--shm-size=16G")
    return Check("shm", "ok", detail)


def this_host() -> list[Check]:
    """The checks of the host itself: who holds the TPU, the container (before the runtime
    takes the TPU, which the holder check must not see)."""
    return [check_holders(device_holders()), *check_container()]


def report(checks: Sequence[Check]) -> dict[str, Any]:
    errors = sum(check.status == "error" for check in checks)
    warnings = sum(check.status == "warn" for check in checks)
    return {"checks": [c.to_dict() for c in checks], "errors": errors, "warnings": warnings}


def _read_lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []
