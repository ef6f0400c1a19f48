"""`make bench` runs its contenders side by side and writes the table (never timed here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import TEMPLATE_DIR, tool_env


def test_make_bench_compares_the_trainer_with_the_hand_written_loop(tmp_path: Path) -> None:
    """It prints the markdown table and writes JSON with every contender's XLA counters."""
    out = tmp_path / "bench"
    result = subprocess.run(
        [
            "make", "-C", str(TEMPLATE_DIR), "bench", f"VENV={sys.prefix}",
            f"BENCH_DIR={out}", "BENCH_ARGS=--workloads mlp --rounds 1",
        ],
        env=tool_env(),
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "| mlp | trainer |" in result.stdout and "vs reference" in result.stdout
    rows = json.loads((out / "bench.json").read_text())
    contenders = {row["contender"]: row for row in rows if row["workload"] == "mlp"}
    assert set(contenders) == {"hand-written", "trainer", "accelerate"}
    assert contenders["hand-written"]["vs_reference"] == 1.0
    assert contenders["trainer"]["compilations"] == 1
    assert all(row["fallback_ops"] == {} for row in contenders.values())
    assert (out / "bench.md").read_text().count("| mlp |") == 3
