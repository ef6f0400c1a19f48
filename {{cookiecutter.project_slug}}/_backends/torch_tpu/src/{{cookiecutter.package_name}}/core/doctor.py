"""Checks of this host's PyTorch + TorchTPU setup, each problem with its fix (`doctor`)."""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
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


def xla_version() -> str | None:
    """torch_xla is not this project's backend: none is used (the pod launcher asks)."""
    return None


def xla_dist_available() -> bool:
    """False: xla_dist is torch_xla's launcher, not this backend's."""
    return False


def tpu_version() -> str | None:
    return package_version("torch_tpu") or package_version("torch-tpu")


def major_minor(version: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


# The torch releases torch-tpu 0.2 is built for.
TORCH_RANGE = ((2, 11), (2, 15))


def check_versions(torch_version: str | None, torch_tpu: str | None, on_tpu: bool) -> Check:
    """torch within torch-tpu's range; torch-tpu itself on a TPU host."""
    if torch_version is None:
        return Check("versions", "error", "torch is not installed", "make install")
    mm = major_minor(torch_version)
    low, high = TORCH_RANGE
    if mm is None or not low <= mm <= high:
        return Check(
            "versions",
            "error",
            f"torch {torch_version} is outside torch-tpu 0.2's 2.11-2.15",
            "make install (the project pins torch 2.13.0)",
        )
    if torch_tpu is None:
        status = "error" if on_tpu else "ok"
        fix = "pip install -e '.[tpu]'" if on_tpu else ""
        detail = f"torch {torch_version}; torch-tpu not installed" + (
            "" if on_tpu else " (not needed off a TPU: the CPU runs the same code)"
        )
        return Check("versions", status, detail, fix)
    return Check("versions", "ok", f"torch {torch_version}, torch-tpu {torch_tpu}")


def check_runtime_variables(environ: Mapping[str, str]) -> list[Check]:
    """torch_xla's runtime variables mean nothing to TorchTPU: say so where they are set."""
    stale = [name for name in (*XRT_VARIABLES, "PJRT_DEVICE", "XLA_USE_BF16") if name in environ]
    if stale:
        return [
            Check(
                "runtime-variables",
                "warn",
                f"torch_xla settings {', '.join(stale)} are set; TorchTPU ignores them",
                f"unset {' '.join(stale)}",
            )
        ]
    return [Check("runtime-variables", "ok", "no torch_xla settings in the environment")]


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


def check_compile_cache(
    environ: Mapping[str, str],
    configured: str,
    last_run: Path | None = None,
    candidates: tuple[str, ...] | None = None,
) -> Check:
    """TorchTPU keeps its compiled programs itself: nothing for the project to set up."""
    return Check("compile-cache", "ok", "compiled programs are kept by TorchTPU itself")


def check_accelerator() -> Check:
    """Find the device this process would train on (run holder checks before this)."""
    from . import runtime

    try:
        accelerator = runtime.configure("auto")
        import torch

        device = runtime.device()
        torch.zeros(1, device=device).add_(1)
    except Exception as error:  # device set-up fails in several exception types
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        fix = "check the tpu extra (torch-tpu, libtpu) and that no other process holds the TPU"
        return Check("accelerator", "error", f"the device did not start: {first}", fix)
    kind = "TPU" if accelerator == "tpu" else "CPU (no TPU on this host)"
    return Check("accelerator", "ok", f"{kind}: {device}")


def run_checks(
    environ: Mapping[str, str], compile_cache: str = "", last_run: Path | None = None
) -> list[Check]:
    """Every check, runtime last (it takes the TPU, which the holder check must not see)."""
    from .runtime import tpu_present

    torch_version = package_version("torch")
    checks = [check_versions(torch_version, tpu_version(), tpu_present())]
    checks += check_runtime_variables(environ)
    checks.append(check_holders(device_holders()))
    checks += check_container()
    checks.append(check_compile_cache(environ, compile_cache, last_run))
    if checks[0].status == "ok":
        checks.append(check_accelerator())
    return checks


def report(checks: Sequence[Check]) -> dict[str, Any]:
    errors = sum(check.status == "error" for check in checks)
    warnings = sum(check.status == "warn" for check in checks)
    return {"checks": [c.to_dict() for c in checks], "errors": errors, "warnings": warnings}


def _read_lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []
