"""`scripts/interrupt-soak.sh` repeats the tests it is given, each round timed, under load."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "interrupt-soak.sh"


def run_soak(args: list[str], **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """The script's run in a process group of its own, and what is left of that group after
    it (its load included): nothing of another test's `stress` counts."""
    command = ["bash", str(SCRIPT), *args, "-p", "no:cacheprovider"]
    environment = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **env}
    with subprocess.Popen(
        command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    ) as script:  # fmt: skip
        stdout, stderr = script.communicate(timeout=300)
    left = subprocess.run(["pgrep", "-g", str(script.pid)], capture_output=True, text=True)
    done = subprocess.CompletedProcess(command, script.returncode, stdout, stderr)
    return done, left.stdout.split()


def soak(
    tmp_path: Path, rounds: int, body: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    test = tmp_path / "test_round.py"
    test.write_text(f"def test_round() -> None:\n    {body}\n")
    return run_soak([str(rounds), str(test)], **env)


def path_without(tool: str, folder: Path) -> str:
    """A PATH of one folder that holds every program of this PATH but `tool`: the machine as
    it is where `tool` was never installed."""
    folder.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        for program in sorted(Path(directory).glob("*")) if Path(directory).is_dir() else ():
            link = folder / program.name
            if program.name != tool and not link.exists() and os.access(program, os.X_OK):
                link.symlink_to(program.resolve())
    return str(folder)


NO_LOAD = "stress is not installed (apt-get install stress): the rounds run without load"


def test_soak_runs_every_round_and_stops_its_load(tmp_path: Path) -> None:
    """It runs the given tests ROUNDS times, says each round's time, and leaves no load (the
    `stress` it started where stress is installed)."""
    result, left = soak(tmp_path, 3, "assert True")
    assert result.returncode == 0, result.stdout + result.stderr
    if shutil.which("stress"):
        assert "stress --cpu" in result.stdout  # the load it stops
    else:
        assert NO_LOAD in result.stderr
    rounds = [line for line in result.stdout.splitlines() if line.startswith("round ")]
    assert [line.split(":")[0] for line in rounds] == [f"round {n} of 3" for n in (1, 2, 3)]
    assert all("1 passed" in line and line.endswith(" s") for line in rounds), rounds
    assert result.stdout.splitlines()[-1].startswith("3 rounds passed in ")
    assert left == []


def test_soak_without_stress_says_so_and_runs_its_rounds_unloaded(tmp_path: Path) -> None:
    """It says in one line that the rounds run without load where `stress` is missing, and runs
    them all the same."""
    hidden = path_without("stress", tmp_path / "bin")
    result, left = soak(tmp_path, 2, "assert True", PATH=hidden)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [NO_LOAD]
    assert "stress --cpu" not in result.stdout
    assert result.stdout.splitlines()[-1].startswith("2 rounds passed in ")
    assert left == []


def test_soak_stops_at_the_first_failing_round(tmp_path: Path) -> None:
    """It stops at the first failure, shows its output and exits non-zero."""
    result, left = soak(tmp_path, 5, "assert 1 == 2, 'the round failed'")
    assert left == []
    assert result.returncode == 1
    assert "the round failed" in result.stdout
    assert "round 1 of 5 FAILED after" in result.stdout
    assert "round 2 of 5" not in result.stdout


def test_soak_runs_a_rounds_files_side_by_side_with_soak_jobs(tmp_path: Path) -> None:
    """With SOAK_JOBS=2 each round runs every selected file in its own pytest, two at once
    (one file's test waits for the other's to start), says each file's time, and stops at
    the first round with a failure (here the second), after showing it."""
    started, rounds_run = tmp_path / "started", tmp_path / "rounds-run"
    (tmp_path / "test_first.py").write_text(
        "import time, pathlib\n"
        f"mark = pathlib.Path({str(started)!r})\n"
        "def test_waits_for_the_other() -> None:\n"
        "    deadline = time.monotonic() + 60\n"
        "    while not mark.exists():\n"
        "        assert time.monotonic() < deadline, 'the files ran one after the other'\n"
        "        time.sleep(0.05)\n"
        "    mark.unlink()\n"
    )
    (tmp_path / "test_second.py").write_text(
        "import pathlib\n"
        f"mark, rounds = pathlib.Path({str(started)!r}), pathlib.Path({str(rounds_run)!r})\n"
        "def test_starts() -> None:\n"
        "    mark.touch()\n"
        "def test_fails_in_the_second_round() -> None:\n"
        "    with rounds.open('a') as out:\n"
        "        out.write('x')\n"
        "    assert len(rounds.read_text()) < 2, 'the second round fails'\n"
    )
    files = [str(tmp_path / "test_first.py"), str(tmp_path / "test_second.py")]
    result, left = run_soak(["3", *files], SOAK_JOBS="2")
    assert result.returncode == 1, result.stdout + result.stderr
    assert left == []
    rounds = [line for line in result.stdout.splitlines() if line.startswith("round ")]
    assert rounds[0].startswith("round 1 of 3: 3 passed in "), rounds
    assert "test_first.py " in rounds[0] and "test_second.py " in rounds[0], rounds
    assert rounds[1].startswith("round 2 of 3 FAILED after "), rounds
    assert "the second round fails" in result.stdout and len(rounds) == 2
