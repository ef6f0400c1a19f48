"""Checks of this host's PyTorch/XLA setup, each problem with its fix (`doctor`)."""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import json
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
    return package_version("torch_xla") or package_version("torch-xla")


def xla_dist_available() -> bool:
    """Whether the installed torch_xla still ships the XRT-era `xla_dist` pod launcher."""
    spec = importlib.util.find_spec("torch_xla")
    if spec is None or not spec.submodule_search_locations:
        return False
    # Look at the files instead of importing: importing torch_xla costs seconds.
    return any(
        (Path(folder) / "distributed" / "xla_dist.py").exists()
        for folder in spec.submodule_search_locations
    )


def major_minor(version: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


def check_versions(torch_version: str | None, xla: str | None) -> Check:
    """torch and torch_xla must share major.minor: a mismatched pair fails at import."""
    if torch_version is None or xla is None:
        missing = "torch" if torch_version is None else "torch_xla"
        return Check("versions", "error", f"{missing} is not installed", "make install")
    detail = f"torch {torch_version}, torch_xla {xla}"
    torch_mm, xla_mm = major_minor(torch_version), major_minor(xla)
    if torch_mm is None or torch_mm != xla_mm:
        fix = f"install the matching pair: pip install torch=={xla} torch_xla=={xla}"
        return Check("versions", "error", detail + " (not in lockstep)", fix)
    return Check("versions", "ok", detail + " (in lockstep)")


def check_runtime_variables(environ: Mapping[str, str]) -> list[Check]:
    """PJRT is the only runtime: XRT variables are leftovers that must go."""
    checks = []
    legacy = [name for name in XRT_VARIABLES if name in environ]
    pjrt = environ.get("PJRT_DEVICE", "")
    if legacy:
        checks.append(
            Check(
                "runtime-variables",
                "error",
                f"legacy XRT settings {', '.join(legacy)} are set, but torch_xla runs on PJRT "
                f"(PJRT_DEVICE={pjrt or 'unset'})",
                f"unset {' '.join(legacy)}",
            )
        )
    if pjrt and pjrt.upper() not in ("TPU", "CPU", "CUDA"):
        checks.append(
            Check("runtime-variables", "error", f"PJRT_DEVICE={pjrt} is unknown", "use TPU or CPU")
        )
    if not checks:
        checks.append(Check("runtime-variables", "ok", f"PJRT_DEVICE={pjrt or 'unset (auto)'}"))
    return checks


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
    """Where compiled graphs are kept, and whether the last run found its graphs there."""
    from .runtime import compile_cache_dir

    on_tpu = environ.get("PJRT_DEVICE", "").upper() == "TPU" or (
        not environ.get("PJRT_DEVICE")
        and bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/*"))
    )
    accelerator = "tpu" if on_tpu else "cpu"
    location = environ.get("XLA_PERSISTENT_CACHE_PATH") or (
        compile_cache_dir(configured, accelerator, candidates)
        if candidates is not None
        else compile_cache_dir(configured, accelerator)
    )
    if not location:
        why = "XLA:CPU cannot reuse compiled graphs" if not on_tpu else "compile_cache is off"
        return Check("compile-cache", "ok", f"no persistent compile cache ({why})")
    detail = f"persistent compile cache at {location}"
    used = _last_cache_use(last_run)
    if used is None:
        return Check("compile-cache", "ok", f"{detail}; no run has recorded its use yet")
    hits, total = used["hits"], used["hits"] + used["misses"]
    verdict = "hit it" if hits else "did not hit it"
    detail += f"; the last run {verdict}: {hits} of {total} graphs loaded from it"
    return Check("compile-cache", "ok", detail)


def _last_cache_use(summary_path: Path | None) -> dict[str, Any] | None:
    """The compile_cache entry of a run's summary.json, if there is one."""
    if summary_path is None or not summary_path.is_file():
        return None
    try:
        used = json.loads(summary_path.read_text()).get("compile_cache")
    except (OSError, ValueError):
        return None
    return used if isinstance(used, dict) else None


def check_accelerator() -> Check:
    """Start the runtime and count its devices (run holder checks before this)."""
    from . import runtime

    try:
        accelerator = runtime.configure("auto")
        import torch_xla
        import torch_xla.runtime as xr

        device = torch_xla.device()
        count = int(xr.global_runtime_device_count())
        hardware = str(xr.device_type() or accelerator.upper())
    except Exception as error:  # the runtime reports setup problems as many exception types
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        fix = "check PJRT_DEVICE, the tpu extra (libtpu) and that no other process holds the TPU"
        return Check("accelerator", "error", f"the XLA runtime did not start: {first}", fix)
    plural = "device" if count == 1 else "devices"
    return Check("accelerator", "ok", f"XLA:{hardware} ({device}), {count} {plural}")


def run_checks(
    environ: Mapping[str, str], compile_cache: str = "", last_run: Path | None = None
) -> list[Check]:
    """Every check, runtime last (it takes the TPU, which the holder check must not see)."""
    torch_version = package_version("torch")
    checks = [check_versions(torch_version, xla_version())]
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
