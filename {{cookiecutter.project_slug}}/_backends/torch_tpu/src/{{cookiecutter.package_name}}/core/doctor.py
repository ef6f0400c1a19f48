"""Checks of this host's PyTorch + TorchTPU setup, each problem with its fix (`doctor`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from .check_order import run_in_order
from .host_checks import XRT_VARIABLES, Check, major_minor, package_version


def backend_version() -> str | None:
    """The installed torch-tpu's version, or None (off a TPU it is not needed)."""
    return package_version("torch_tpu") or package_version("torch-tpu")


def legacy_launcher_problem() -> str | None:
    """Why POD_LAUNCHER=xla_dist cannot launch here: it is torch_xla's launcher."""
    return (
        "POD_LAUNCHER=xla_dist is torch_xla's pod launcher, not TorchTPU's: "
        "unset POD_LAUNCHER to launch through gcloud ssh"
    )


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


def check_compile_cache(environ: Mapping[str, str], *settings: object, **named: object) -> Check:
    """TorchTPU keeps its compiled programs itself: nothing for the project to set up,
    whatever the compile cache's settings (`configured`, `last_run`, `candidates`)."""
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
    """Every check: torch within torch-tpu's range first, the device last."""
    from .runtime import tpu_present

    return run_in_order(
        check_versions(package_version("torch"), backend_version(), tpu_present()),
        lambda: check_runtime_variables(environ),
        lambda: check_compile_cache(environ, compile_cache, last_run),
        check_accelerator,
    )
