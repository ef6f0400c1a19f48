"""Multislice: the slice count a type can form, and the environment the slices meet through."""

from __future__ import annotations

import pytest

from {{ cookiecutter.package_name }}.core import multislice, runtime, tpu_generations

from backend_facts import MESH_SPANS_SLICES

# The slices a mesh spans when the launcher sets two: on a TPU, and off one.
ON_TPU_AND_OFF = [("TPU", 2 if MESH_SPANS_SLICES else 1), ("CPU", 1)]


def test_one_slice_without_the_multislice_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """It reads 1 slice and slice 0 when the launcher set nothing."""
    for name in (multislice.NUM_SLICES, multislice.SLICE_ID):
        monkeypatch.delenv(name, raising=False)
    assert (runtime.slice_count(), runtime.slice_index()) == (1, 0)


def test_slice_count_and_index_come_from_what_the_launcher_sets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It reads back the slice count and this worker's slice from the launcher's variables."""
    for name, value in multislice.multislice_environment("10.0.0.2", 4, 3).items():
        monkeypatch.setenv(name, value)
    assert (runtime.slice_count(), runtime.slice_index()) == (4, 3)


@pytest.mark.parametrize(("device", "slices"), ON_TPU_AND_OFF)
def test_the_mesh_spans_slices_on_tpu_only(
    device: str, slices: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It spans the mesh over the launcher's slices on TPU (torch_xla; torch_tpu lays no mesh
    over slices); off a TPU, where every worker of a pod rehearsal is a world of its own,
    over none."""
    for name, value in multislice.multislice_environment("10.0.0.2", 2, 1).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PJRT_DEVICE", device)
    assert (runtime.slice_count(), runtime.mesh_slice_count()) == (2, slices)


@pytest.mark.parametrize(
    "count,index,message",
    [("two", "0", "MEGASCALE_NUM_SLICES='two'"), ("2", "2", "MEGASCALE_SLICE_ID=2 is not below")],
)
def test_a_broken_multislice_environment_is_named(
    monkeypatch: pytest.MonkeyPatch, count: str, index: str, message: str
) -> None:
    """It names the variable that is not a slice count or index, in one line."""
    monkeypatch.setenv(multislice.NUM_SLICES, count)
    monkeypatch.setenv(multislice.SLICE_ID, index)
    with pytest.raises(multislice.MultisliceError, match=message):
        runtime.slice_index()


def test_the_environment_names_worker_0_of_slice_0_and_the_port() -> None:
    """It gives every worker the coordinator with its port, the slice count and its slice."""
    assert multislice.multislice_environment("10.1.2.3", 2, 1) == {
        "MEGASCALE_COORDINATOR_ADDRESS": "10.1.2.3:8081",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": "1",
        "MEGASCALE_PORT": "8081",
    }


{%- if cookiecutter.backend == "torch_xla" %}


@pytest.mark.parametrize("accelerator_type", ["v4-8", "v5litepod-16", "v5p-16", "v6e-256"])
def test_generations_from_v4_form_a_multislice(accelerator_type: str) -> None:
    """It accepts several slices of v4, v5e, v5p and v6e."""
    multislice.check_slices(accelerator_type, 4)


@pytest.mark.parametrize("accelerator_type", ["v2-8", "v3-32"])
def test_v2_and_v3_are_one_slice_only(accelerator_type: str) -> None:
    """It refuses two slices of v2 or v3 in one line, and accepts one."""
    with pytest.raises(multislice.MultisliceError) as raised:
        multislice.check_slices(accelerator_type, 2)
    assert str(raised.value).startswith(f"2 slices of {accelerator_type}: ")
    assert "\n" not in str(raised.value)
    multislice.check_slices(accelerator_type, 1)
{%- else %}


@pytest.mark.parametrize("accelerator_type", ["v5p-16", "v6e-256", ""])
def test_several_slices_are_refused_on_a_backend_without_a_mesh_over_them(
    accelerator_type: str,
) -> None:
    """It refuses two slices in one line, whatever the generation (torch_tpu lays no mesh
    over slices: each slice would train on its own), and accepts one."""
    with pytest.raises(multislice.MultisliceError) as raised:
        multislice.check_slices(accelerator_type, 2)
    assert str(raised.value).startswith("2 slices: the torch_tpu backend lays no device mesh")
    assert "\n" not in str(raised.value)
    multislice.check_slices(accelerator_type, 1)


def test_a_run_started_with_the_multislice_environment_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It refuses a run whose launcher set two slices before anything starts."""
    from {{ cookiecutter.package_name }}.core import make_plan

    for name, value in multislice.multislice_environment("10.0.0.2", 2, 0).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(multislice.MultisliceError, match="lays no device mesh over slices"):
        make_plan("cpu", 1, "single")
{%- endif %}


@pytest.mark.parametrize("text", ["0", "-1", "01", "2 3", "", "two"])
def test_slice_counts_are_whole_numbers_from_one(text: str) -> None:
    """It refuses a slice count that is not a whole number of at least 1."""
    with pytest.raises(multislice.MultisliceError, match="not a whole number of at least 1"):
        multislice.parse_slice_count(text)


def test_the_table_says_which_generations_form_a_multislice() -> None:
    """It takes the multislice column of the TPU table: v4 and later."""
    able = {key for key, g in tpu_generations.generations().items() if g.multislice}
    assert able == {"v4", "v5litepod", "v5p", "v6e", "tpu7x"}
