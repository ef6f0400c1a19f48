"""The runtime starts only when asked, finds the accelerator, and reports XLA health."""

import pytest
import torch

from {{ cookiecutter.package_name }}.core import (
    RuntimeConfigError,
    XlaGuard,
    XlaHealthError,
    detect_accelerator,
)

IMPORT_CHILD = """
import json, sys
import {{ cookiecutter.package_name }}
import {{ cookiecutter.package_name }}.core
import {{ cookiecutter.package_name }}.cli
import {{ cookiecutter.package_name }}.training

imported = "torch_xla" in sys.modules
started = bool(sys.modules["torch_xla"]._XLAC._xla_runtime_is_initialized()) if imported else False
print(json.dumps({"torch_xla_imported": imported, "runtime_started": started}))
"""


def test_importing_the_package_does_not_start_the_xla_runtime(python_subprocess):
    """It imports the package, core, cli and training without starting the XLA runtime."""
    result = python_subprocess(["-c", IMPORT_CHILD])

    assert result["runtime_started"] is False


def test_auto_detects_xla_cpu_without_a_tpu(monkeypatch):
    """It resolves 'auto' to 'cpu' on a host without a TPU and without PJRT_DEVICE."""
    monkeypatch.delenv("PJRT_DEVICE")
    monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)

    assert detect_accelerator("auto") == "cpu"


def test_requesting_a_missing_tpu_says_what_to_do(monkeypatch):
    """It refuses 'tpu' on a host without one and suggests --accelerator cpu."""
    monkeypatch.delenv("PJRT_DEVICE")
    monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)

    with pytest.raises(RuntimeConfigError, match=r"no TPU was found.*--accelerator cpu"):
        detect_accelerator("tpu")


def test_unknown_accelerator_is_rejected():
    """It rejects an accelerator name it does not know, listing the choices."""
    with pytest.raises(RuntimeConfigError, match="auto, tpu, cpu"):
        detect_accelerator("gpu")


def make_step(device, rows: int):
    """A tiny step whose graph depends only on the batch's row count."""
    import torch_xla

    weight = torch.full((5, 3), 0.5, device=device)

    def step() -> torch.Tensor:
        out = (torch.ones(rows, 5, device=device) @ weight).tanh().sum()
        torch_xla.sync()
        return out

    return step


def test_guard_passes_when_a_warm_step_repeats(xla_device):
    """It stays silent when an already-compiled step runs again."""
    step = make_step(xla_device, rows=11)
    step()
    step()

    with XlaGuard() as guard:
        step()

    assert guard.delta is not None
    assert guard.delta.compilations == 0


def test_guard_flags_a_new_shape_after_warm_up(xla_device):
    """It raises when a new batch shape compiles a new graph after warm-up."""
    warm = make_step(xla_device, rows=13)
    warm()
    warm()

    with pytest.raises(XlaHealthError, match="compiled"), XlaGuard():
        make_step(xla_device, rows=17)()


def test_guard_flags_a_host_transfer(xla_device):
    """It raises when `.item()` copies a value to the host inside the block."""
    step = make_step(xla_device, rows=19)
    step()
    step()

    with pytest.raises(XlaHealthError, match="transfer"), XlaGuard():
        step().item()
