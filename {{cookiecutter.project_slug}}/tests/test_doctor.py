"""`doctor`: versions, runtime, TPU holders, container flags, each problem with its fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from {{ cookiecutter.package_name }}.cli import app
from {{ cookiecutter.package_name }}.core import doctor, host_checks

from backend_facts import DOCTOR_DEVICE, DOCTOR_VERSIONS
from training_helpers import cli_env

PACKAGE = "{{ cookiecutter.package_name }}"


def test_doctor_off_a_tpu_reports_versions_and_the_device() -> None:
    """It prints the backend's versions and the device off a TPU, and exits 0."""
    env = {k: v for k, v in cli_env().items() if not k.startswith(("XRT_", "XLA_PERSISTENT"))}
    result = subprocess.run(
        [sys.executable, "-m", PACKAGE, "doctor"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for said in DOCTOR_VERSIONS:
        assert said in result.stdout, result.stdout
    accelerator = next(line for line in result.stdout.splitlines() if " accelerator " in line)
    assert accelerator.startswith("ok") and DOCTOR_DEVICE in accelerator, accelerator
    assert result.stdout.strip().splitlines()[-1].startswith("doctor: 0 error(s)")
{%- if cookiecutter.backend == "torch_tpu" %}


def test_doctor_warns_of_torch_xla_settings(restore_environ: None) -> None:
    """It warns that TorchTPU ignores torch_xla's settings and says to unset them."""
    env = {"XRT_TPU_CONFIG": "localservice;0;localhost:51011", "PJRT_DEVICE": "CPU"}
    result = CliRunner().invoke(app, ["doctor"], env=env)
    assert result.exit_code == 0, result.output
    assert "torch_xla settings XRT_TPU_CONFIG, PJRT_DEVICE are set" in result.stdout
    assert "fix: unset XRT_TPU_CONFIG PJRT_DEVICE" in result.stdout
{%- else %}


def test_doctor_fails_on_a_legacy_xrt_setting(restore_environ: None) -> None:
    """It exits 1 when XRT_TPU_CONFIG is set and says to unset it."""
    env = {"XRT_TPU_CONFIG": "localservice;0;localhost:51011", "PJRT_DEVICE": "CPU"}
    result = CliRunner().invoke(app, ["doctor"], env=env)
    assert result.exit_code == 1, result.output
    assert "legacy XRT settings XRT_TPU_CONFIG are set" in result.stdout
    assert "fix: unset XRT_TPU_CONFIG" in result.stdout
{%- endif %}


def test_doctor_json_lists_every_check(restore_environ: None) -> None:
    """It prints machine-readable checks with error and warning counts."""
    result = CliRunner().invoke(app, ["doctor", "--json"], env={"PJRT_DEVICE": "CPU"})
    report = json.loads(result.stdout)
    names = {check["name"] for check in report["checks"]}
    assert {"versions", "runtime-variables", "tpu-holders", "compile-cache"} <= names
    assert result.exit_code == (1 if report["errors"] else 0)
{%- if cookiecutter.backend == "torch_tpu" %}


@pytest.mark.parametrize(
    "torch_version,torch_tpu,on_tpu,status",
    [
        ("2.13.0", None, False, "ok"),
        ("2.13.0+cpu", "0.2.0", True, "ok"),
        ("2.11.0", None, False, "ok"),
        ("2.9.0", None, False, "error"),
        ("2.16.0", "0.2.0", True, "error"),
        ("2.13.0", None, True, "error"),
        (None, None, False, "error"),
    ],
)
def test_versions_are_torch_within_torch_tpus_range(
    torch_version: str | None, torch_tpu: str | None, on_tpu: bool, status: str
) -> None:
    """It accepts torch 2.11-2.15, and torch-tpu missing only off a TPU."""
    check = doctor.check_versions(torch_version, torch_tpu, on_tpu)
    assert check.status == status
    assert (check.fix != "") == (status == "error")
{%- else %}


@pytest.mark.parametrize(
    "torch_version,xla_version,status",
    [
        ("2.9.0", "2.9.0", "ok"),
        ("2.9.1+cpu", "2.9.0", "ok"),
        ("2.10.0", "2.9.0", "error"),
        ("2.9.0", "3.9.0", "error"),
        (None, "2.9.0", "error"),
        ("2.9.0", None, "error"),
    ],
)
def test_version_lockstep_compares_major_and_minor(
    torch_version: str | None, xla_version: str | None, status: str
) -> None:
    """It accepts torch/torch_xla pairs with the same major.minor only."""
    check = doctor.check_versions(torch_version, xla_version)
    assert check.status == status
    assert (check.fix != "") == (status == "error")


def test_mismatched_versions_name_the_matching_install() -> None:
    """It tells how to install a matching pair."""
    check = doctor.check_versions("2.8.0", "2.9.0")
    assert check.fix == "install the matching pair: pip install torch==2.9.0 torch_xla==2.9.0"
{%- endif %}


def test_holders_of_a_device_file_are_found_with_the_fix(tmp_path: Path) -> None:
    """It finds a process holding a device file and tells how to stop it."""
    device = tmp_path / "accel0"
    device.touch()
    with device.open() as held:  # the holder has it from fork on, until it is killed
        holder = subprocess.Popen(["tail", "-f", "/dev/null"], stdin=held)
    try:
        holders = host_checks.device_holders([str(tmp_path / "accel*")])
        check = host_checks.check_holders(holders)
    finally:
        holder.kill()
        holder.wait()
    assert holder.pid in holders
    assert check.status == "error" and f"kill {holder.pid}" in check.fix


def test_no_device_files_means_no_holders(tmp_path: Path) -> None:
    """It reports no holders when there are no device files."""
    assert host_checks.device_holders([str(tmp_path / "accel*")]) == {}
    assert host_checks.check_holders({}).status == "ok"


def test_full_capabilities_mean_privileged() -> None:
    """It calls a container privileged only when CapEff holds every capability."""
    assert host_checks.capabilities_full("CapEff:\t000001ffffffffff\n", 40)
    assert not host_checks.capabilities_full("CapEff:\t000001fffeffffff\n", 40)
    assert not host_checks.capabilities_full("CapEff:\t00000000a80425fb\n", 40)


def test_small_shm_is_a_warning(tmp_path: Path) -> None:
    """It warns with the --shm-size fix when /dev/shm is below 1 GiB."""
    check = host_checks.check_shm(str(tmp_path / "missing"))
    assert check.status == "warn" and "--shm-size" in check.fix
    stats = os.statvfs(tmp_path)
    big_enough = stats.f_frsize * stats.f_blocks >= host_checks.MIN_SHM_BYTES
    assert host_checks.check_shm(str(tmp_path)).status == ("ok" if big_enough else "warn")
{%- if cookiecutter.backend == "torch_xla" %}


# torch_xla only: its persistent compile cache (TorchTPU keeps its compiled programs itself) and
# its XRT-era pod launcher.
def test_compile_cache_location_comes_from_env_or_config() -> None:
    """It reports the persistent cache from XLA_PERSISTENT_CACHE_PATH, else the config."""
    from_env = doctor.check_compile_cache({"XLA_PERSISTENT_CACHE_PATH": "/c"}, "/cfg")
    assert from_env.detail.startswith("persistent compile cache at /c;")
    assert "persistent compile cache at /cfg" in doctor.check_compile_cache({}, "/cfg").detail
    assert (
        "compile_cache is off" in doctor.check_compile_cache({"PJRT_DEVICE": "TPU"}, "off").detail
    )


def test_compile_cache_is_on_by_default_on_tpu_only(tmp_path: Path) -> None:
    """It picks a shared cache folder for `auto` on TPU, and none on XLA:CPU."""
    shared = (str(tmp_path / "var-cache"), str(tmp_path / "home-cache"))
    on_cpu = doctor.check_compile_cache({"PJRT_DEVICE": "CPU"}, "auto", candidates=shared)
    assert on_cpu.detail == "no persistent compile cache (XLA:CPU cannot reuse compiled graphs)"
    on_tpu = doctor.check_compile_cache({"PJRT_DEVICE": "TPU"}, "auto", candidates=shared)
    assert on_tpu.detail.startswith(f"persistent compile cache at {shared[0]};")
    assert (tmp_path / "var-cache").is_dir()


def test_compile_cache_line_says_whether_the_last_run_hit_it(tmp_path: Path) -> None:
    """It reads the last run's summary: how many graphs came from the cache."""
    summary = tmp_path / "summary.json"
    env = {"XLA_PERSISTENT_CACHE_PATH": "/c"}
    assert "no run has recorded" in doctor.check_compile_cache(env, "auto", summary).detail
    summary.write_text(json.dumps({"compile_cache": {"path": "/c", "hits": 3, "misses": 1}}))
    assert (
        "the last run hit it: 3 of 4 graphs"
        in doctor.check_compile_cache(env, "auto", summary).detail
    )
    summary.write_text(json.dumps({"compile_cache": {"path": "/c", "hits": 0, "misses": 2}}))
    assert "did not hit it: 0 of 2" in doctor.check_compile_cache(env, "auto", summary).detail


def test_this_torch_xla_has_no_xla_dist() -> None:
    """It knows torch_xla 2.9 no longer ships the xla_dist pod launcher."""
    assert doctor.backend_version() is not None
    release = host_checks.major_minor(doctor.backend_version() or "")
    assert doctor.xla_dist_available() is (release <= (2, 0))
{%- endif %}
