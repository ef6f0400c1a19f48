"""The order of `doctor`'s checks, whatever the backend.

The versions first; the runtime's variables, this host (devices, holders, container,
shared memory) and the compile cache next; the accelerator last, and only if the versions
are right: starting the runtime takes the TPU, which the holder check must not see.
"""

from __future__ import annotations

from collections.abc import Callable

from .host_checks import Check, this_host


def run_in_order(
    versions: Check,
    runtime_variables: Callable[[], list[Check]],
    compile_cache: Callable[[], Check],
    accelerator: Callable[[], Check],
) -> list[Check]:
    """Run the backend's checks and this host's in doctor's order; return every result."""
    checks = [versions]
    checks += runtime_variables()
    checks += this_host()
    checks.append(compile_cache())
    if versions.status == "ok":
        checks.append(accelerator())
    return checks
