"""Where each contender's host time goes in the steady state, side by side.

On XLA:CPU the host's Python and the device's compute share the same cores, so every
millisecond a loop spends in Python per step is taken from the model. Each contender runs
twice under cProfile, for `total` and `2 * total` steps, after a first run that compiles
its graphs; the difference of the two profiles, divided by `total`, is its cost per step
(set-up and the first steps cancel out). The report lists the functions where the
contenders differ most.
"""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Callable
from typing import Any

Key = str  # "file:line(function)"
TOP = 12  # functions shown per workload


def _times(profile: cProfile.Profile) -> dict[Key, tuple[float, float]]:
    """(own time, time with callees) of every function, in seconds."""
    stats = pstats.Stats(profile)
    found: dict[Key, tuple[float, float]] = {}
    for (path, line, name), row in stats.stats.items():  # type: ignore[attr-defined]
        _, _, own, cumulative, _ = row
        short = "/".join(path.split("/")[-2:])
        found[f"{short}:{line}({name})"] = (own, cumulative)
    return found


def per_step(run: Callable[[int], Any], total: int) -> dict[Key, tuple[float, float]]:
    """Seconds per steady-state step of every function: (2T run - T run) / T, after a first
    run that fills the process's graph cache (the profiled runs compile nothing)."""
    run(total)
    profiles = []
    for steps in (total, 2 * total):
        profile = cProfile.Profile()
        profile.runcall(run, steps)
        profiles.append(_times(profile))
    short, long = profiles
    return {
        key: ((own - short.get(key, (0.0, 0.0))[0]) / total,
              (cumulative - short.get(key, (0.0, 0.0))[1]) / total)
        for key, (own, cumulative) in long.items()
    }  # fmt: skip


def report(workload: str, profiles: dict[str, dict[Key, tuple[float, float]]]) -> str:
    """Host milliseconds per step of each contender, and the functions that differ most."""
    names = list(profiles)
    totals = {name: sum(own for own, _ in p.values()) * 1e3 for name, p in profiles.items()}
    keys = set().union(*profiles.values())

    def own_ms(name: str, key: Key) -> float:
        return profiles[name].get(key, (0.0, 0.0))[0] * 1e3

    spread = sorted(
        keys, key=lambda k: -(max(own_ms(n, k) for n in names) - min(own_ms(n, k) for n in names))
    )
    lines = [
        f"### {workload}: host time per steady-state step (ms, cProfile: (2T - T) / T)",
        "",
        "| function | " + " | ".join(names) + " |",
        "| --- | " + " | ".join("---:" for _ in names) + " |",
        "| **all Python and waits** | " + " | ".join(f"{totals[n]:.2f}" for n in names) + " |",
    ]
    for key in spread[:TOP]:
        lines.append(f"| `{key}` | " + " | ".join(f"{own_ms(n, key):.3f}" for n in names) + " |")
    return "\n".join(lines)
