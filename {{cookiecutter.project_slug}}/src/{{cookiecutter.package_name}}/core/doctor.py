"""Checks of this host's PyTorch/XLA setup, each problem with its fix (`doctor`)."""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .check_order import run_in_order
from .host_checks import XRT_VARIABLES, Check, major_minor, package_version


def backend_version() -> str | None:
    """The installed torch_xla's version, or None."""
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


def legacy_launcher_problem() -> str | None:
    """Why POD_LAUNCHER=xla_dist cannot launch here, or None when it can."""
    if xla_dist_available():
        return None
    return (
        "POD_LAUNCHER=xla_dist needs torch_xla.distributed.xla_dist, which torch_xla "
        f"{backend_version() or '(not installed)'} does not have (it left with XRT after 2.0): "
        "unset POD_LAUNCHER to launch through gcloud ssh"
    )


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
    """Every check: torch and torch_xla in lockstep first, the XLA runtime last."""
    return run_in_order(
        check_versions(package_version("torch"), backend_version()),
        lambda: check_runtime_variables(environ),
        lambda: check_compile_cache(environ, compile_cache, last_run),
        check_accelerator,
    )
