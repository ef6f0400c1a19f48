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


def test_soak_runs_a_rounds_files_side_by_side_with_soak_jobs(tmp_path: Path) -> None:
    """With SOAK_JOBS=2 each round runs every selected file in its own pytest, two at once
    (one file's test waits for the other's to start), says each file's time, and stops at
    the first round with a failure, after showing it."""
    started = tmp_path / "started"
    waits = (
        "import time, pathlib\n"
        f"mark = pathlib.Path({str(started)!r})\n"
        "def test_waits_for_the_other() -> None:\n"
        "    deadline = time.monotonic() + 60\n"
        "    while not mark.exists():\n"
        "        assert time.monotonic() < deadline, 'the files ran one after the other'\n"
        "        time.sleep(0.05)\n"
        "    mark.unlink()\n"
    )
    (tmp_path / "test_first.py").write_text(waits)
    (tmp_path / "test_second.py").write_text(
        f"import pathlib\ndef test_starts() -> None:\n    pathlib.Path({str(started)!r}).touch()\n"
        "def test_also() -> None:\n    pass\n"
    )
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "SOAK_JOBS": "2"}
    files = [str(tmp_path / "test_first.py"), str(tmp_path / "test_second.py")]
    result = subprocess.run(
        ["bash", str(SCRIPT), "2", *files, "-p", "no:cacheprovider"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    rounds = [line for line in result.stdout.splitlines() if line.startswith("round ")]
    assert len(rounds) == 2 and all(": 3 passed in " in line for line in rounds), rounds
    assert all("test_first.py " in line and "test_second.py " in line for line in rounds)

    (tmp_path / "test_second.py").write_text("def test_fails() -> None:\n    assert 1 == 2, 'no'\n")
    failed = subprocess.run(
        ["bash", str(SCRIPT), "3", *files, "-p", "no:cacheprovider"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert failed.returncode == 1
    assert "assert 1 == 2" in failed.stdout and "round 1 of 3 FAILED after" in failed.stdout
    assert "round 2 of 3" not in failed.stdout
