"""`scripts/interrupt-soak.sh` repeats the tests it is given, each round timed, under load."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "interrupt-soak.sh"


def soak(tmp_path: Path, rounds: int, body: str) -> subprocess.CompletedProcess[str]:
    test = tmp_path / "test_round.py"
    test.write_text(f"def test_round() -> None:\n    {body}\n")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        ["bash", str(SCRIPT), str(rounds), str(test), "-p", "no:cacheprovider"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def stress_workers() -> int:
    found = subprocess.run(["pgrep", "-x", "stress"], capture_output=True, text=True)
    return len(found.stdout.split())


def test_soak_runs_every_round_and_stops_its_load(tmp_path: Path) -> None:
    """It runs the given tests ROUNDS times, says each round's time, and leaves no load."""
    before = stress_workers()
    result = soak(tmp_path, 3, "assert True")
    assert result.returncode == 0, result.stdout + result.stderr
    rounds = [line for line in result.stdout.splitlines() if line.startswith("round ")]
    assert [line.split(":")[0] for line in rounds] == [f"round {n} of 3" for n in (1, 2, 3)]
    assert all("1 passed" in line and line.endswith(" s") for line in rounds), rounds
    assert result.stdout.splitlines()[-1].startswith("3 rounds passed in ")
    assert stress_workers() == before


def test_soak_stops_at_the_first_failing_round(tmp_path: Path) -> None:
    """It stops at the first failure, shows its output and exits non-zero."""
    result = soak(tmp_path, 5, "assert 1 == 2, 'the round failed'")
    assert result.returncode == 1
    assert "the round failed" in result.stdout
    assert "round 1 of 5 FAILED after" in result.stdout
    assert "round 2 of 5" not in result.stdout
