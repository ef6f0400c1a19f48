"""`make bench` runs its contenders side by side and writes the table (never timed here)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from helpers import TEMPLATE_DIR, tool_env


def test_make_bench_compares_the_trainer_with_the_hand_written_loop(tmp_path: Path) -> None:
    """It prints the markdown tables and writes JSON with every contender's XLA counters,
    time to first step, and the depth sweep with scanned losses equal to unrolled ones;
    with --profile, each contender's wall and host time per step, side by side."""
    out = tmp_path / "bench"
    result = subprocess.run(
        [
            "make", "-C", str(TEMPLATE_DIR), "bench", f"VENV={sys.prefix}",
            f"BENCH_DIR={out}", "BENCH_ARGS=--workloads mlp --rounds 1 --depths 2,4 --profile",
        ],
        env=tool_env(),
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "| mlp | trainer |" in result.stdout and "vs reference" in result.stdout
    written = json.loads((out / "bench.json").read_text())
    rows = written["rows"]
    contenders = {row["contender"]: row for row in rows if row["workload"] == "mlp"}
    assert set(contenders) == {"hand-written", "trainer", "accelerate"}
    assert contenders["hand-written"]["vs_reference"] == 1.0
    assert contenders["trainer"]["compilations"] == 1
    assert all(row["fallback_ops"] == {} for row in contenders.values())
    assert (out / "bench.md").read_text().count("| mlp |") == 3
    for name, row in contenders.items():
        assert row["first_step"] > 0 and row["host_ms"] >= 0, (name, row)
    sweep = {(row["blocks"], row["scanned"]): row for row in written["depths"]}
    assert set(sweep) == {(2, False), (2, True), (4, False), (4, True)}
    for blocks in (2, 4):
        assert sweep[(blocks, True)]["graphs"] == sweep[(blocks, False)]["graphs"] == 1
        for scanned, plain in zip(
            sweep[(blocks, True)]["losses"], sweep[(blocks, False)]["losses"], strict=True
        ):
            assert abs(scanned - plain) <= 1e-5 * abs(plain)
    assert "| 4 |" in result.stdout and "first step scanned" in result.stdout
    profile = (out / "profile.md").read_text().splitlines()
    assert profile[0].startswith("### mlp: time per steady-state step")
    assert profile[2] == "| function | hand-written | trainer | accelerate |"
    assert profile[4].startswith("| **wall** |")
    assert profile[5].startswith("| **host (main thread CPU)** |")
    # Wall and host time per step are differences of two profiled runs (2T - T): on a busy
    # machine either can come out below zero. They are measurements, not checked here.
    for row in profile[4:6]:
        assert all(math.isfinite(float(cell)) for cell in row.split("|")[2:5]), row
    functions = [line for line in profile[7:] if line.startswith("| `")]
    assert len(functions) >= 5 and all(line.count("|") == 5 for line in functions), profile
