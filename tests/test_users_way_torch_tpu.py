"""The torch_tpu bake's `make install && make test`, run the way its README tells a user:
in the bake's own `.venv`, from a shell where no environment is activated (a file of its own,
so the two test workers run it beside the default bake's suite)."""

from __future__ import annotations

import re

import pytest

from helpers import pytest_summary
from users_shell import WHOLE_SUITE_TIMEOUT, InstalledBake, run


def installed_torch_2_13(installed: InstalledBake) -> None:
    """The bake's own venv holds torch 2.13 and neither torch_xla nor torch-tpu."""
    listed = run([str(installed.python), "-m", "pip", "list"], installed.project, installed.env,
                 timeout=120)  # fmt: skip
    assert re.search(r"^torch\s+2\.13\.0", listed, re.M), listed
    assert not re.search(r"^torch[-_](xla|tpu)\s", listed, re.M | re.I), listed


# What `make test` leaves out of the torch_tpu bake's quick tier: the tests of code that does
# not ask the backend (preparing and reading data, Ray, goodput, the soak script, profiling,
# spot tasks, the slower end-to-end language model), which the default bake's run covers;
# `make test-full` runs them here too.
BACKEND_FREE = (
    "test_data_prepare.py", "test_data_ray.py", "test_data_training.py", "test_goodput.py",
    "test_interrupt_soak.py", "test_diagnostics.py", "test_gcs_emulator.py", "test_spot.py",
    "test_task_lm.py", "test_streaming.py",
)  # fmt: skip


@pytest.mark.suite
def test_torch_tpu_bake_installs_and_passes_its_quick_tier_from_a_plain_shell(
    torch_tpu_installed: InstalledBake,
) -> None:
    """It passes the torch_tpu bake's `make install && make test-fast` (torch 2.13, no
    torch-tpu: its tests run every layout as CPU processes over gloo), its own venv, not
    activated: every test file of the code that asks the backend, the end-to-end trainings
    aside."""
    installed_torch_2_13(torch_tpu_installed)
    project, env = torch_tpu_installed.project, torch_tpu_installed.env
    for name in BACKEND_FREE:
        assert (project / "tests" / name).is_file(), f"the bake has no tests/{name}"
    ignored = " ".join(f"--ignore=tests/{name}" for name in BACKEND_FREE)
    args = f"PYTEST_ARGS=-q -p no:cacheprovider {ignored}"
    output = run(["make", "test-fast", args], project, env, 2400)
    counts = pytest_summary(output)
    assert counts.get("passed", 0) > 0 and not counts.get("failed"), output[-3000:]
    assert not counts.get("error"), output[-3000:]


@pytest.mark.full
def test_torch_tpu_bake_installs_and_passes_its_whole_suite_from_a_plain_shell(
    torch_tpu_installed: InstalledBake,
) -> None:
    """It passes the torch_tpu bake's whole `make test` the same way, its end-to-end
    trainings included (`make test-full`: half an hour more on two cores)."""
    installed_torch_2_13(torch_tpu_installed)
    project, env = torch_tpu_installed.project, torch_tpu_installed.env
    args = "PYTEST_ARGS=-q -p no:cacheprovider"
    output = run(["make", "test", args], project, env, WHOLE_SUITE_TIMEOUT)
    counts = pytest_summary(output)
    assert counts.get("passed", 0) > 0 and not counts.get("failed"), output[-3000:]
    assert not counts.get("deselected") and not counts.get("error"), output[-3000:]
