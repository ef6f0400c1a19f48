"""Where each contender's host time goes in the steady state, side by side.

A TPU runs a small model's step in a millisecond or two; the host's time per step (Python,
tracing, dispatch) is what it waits on between steps. Each contender runs twice under
cProfile, for `total` and `2 * total` steps, after a first run that compiles its graphs;
the difference of the two, divided by `total`, is its cost per step (set-up and the first
steps cancel out). The profiler's clock is the main thread's CPU time, so waiting for the
device costs nothing in it: the wall time per step less the host's is the device wait. The
report lists both, then the functions where the contenders differ most.
"""

from __future__ import annotations

import cProfile
import pstats
import time
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


def per_step(run: Callable[[int], Any], total: int) -> dict[str, Any]:
    """Host CPU seconds per steady-state step of every function ((2T run - T run) / T) and
    wall seconds per step, after a first run that fills the process's graph cache (the
    profiled runs compile nothing)."""
    run(total)
    profiles, walls = [], []
    for steps in (total, 2 * total):
        profile = cProfile.Profile(time.thread_time)
        began = time.perf_counter()
        profile.runcall(run, steps)
        walls.append(time.perf_counter() - began)
        profiles.append(_times(profile))
    short, long = profiles
    functions = {
        key: ((own - short.get(key, (0.0, 0.0))[0]) / total,
              (cumulative - short.get(key, (0.0, 0.0))[1]) / total)
        for key, (own, cumulative) in long.items()
    }  # fmt: skip
    return {"functions": functions, "wall": (walls[1] - walls[0]) / total}


def report(workload: str, runs: dict[str, dict[str, Any]]) -> str:
    """Host and wall milliseconds per step of each contender, and the functions that differ
    most."""
    profiles = {name: run["functions"] for name, run in runs.items()}
    names = list(profiles)
    totals = {name: sum(own for own, _ in p.values()) * 1e3 for name, p in profiles.items()}
    walls = {name: run["wall"] * 1e3 for name, run in runs.items()}
    keys = set().union(*profiles.values())

    def own_ms(name: str, key: Key) -> float:
        return profiles[name].get(key, (0.0, 0.0))[0] * 1e3

    spread = sorted(
        keys, key=lambda k: -(max(own_ms(n, k) for n in names) - min(own_ms(n, k) for n in names))
    )
    lines = [
        f"### {workload}: time per steady-state step (ms, cProfile on the main thread's CPU "
        "time: (2T - T) / T)",
        "",
        "| function | " + " | ".join(names) + " |",
        "| --- | " + " | ".join("---:" for _ in names) + " |",
        "| **wall** | " + " | ".join(f"{walls[n]:.2f}" for n in names) + " |",
        "| **host (main thread CPU)** | " + " | ".join(f"{totals[n]:.2f}" for n in names) + " |",
        "| **device wait (wall - host)** | "
        + " | ".join(f"{walls[n] - totals[n]:.2f}" for n in names)
        + " |",
    ]
    for key in spread[:TOP]:
        lines.append(f"| `{key}` | " + " | ".join(f"{own_ms(n, key):.3f}" for n in names) + " |")
    return "\n".join(lines)
