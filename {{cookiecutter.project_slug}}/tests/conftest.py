"""Shared fixtures: the device of the in-process tests, the backend's step guard and
compiled step, fresh interpreters for the rest; what they expect of the backend is in
tests/backend_facts.py."""

import os
from collections.abc import Callable
from typing import Any

import pytest

import backend_facts

# Fixtures `gcs_emulator` and `gcs_bucket`: a local GCS server for `gs://` checkpoints;
# `python_subprocess`, `restore_environ` and `gated_src` (tests/subprocess_fixtures.py).
pytest_plugins = ["gcs_emulator", "subprocess_fixtures"]
# The runtime reads its accelerator once, when it starts: set it before any test touches it.
for _name, _value in backend_facts.CHILD_ENV.items():
    os.environ.setdefault(_name, _value)
# No test reaches W&B's servers: a run that logs to W&B writes its files for `wandb sync`.
os.environ["WANDB_MODE"] = "offline"


@pytest.fixture(scope="session")
def backend() -> Any:
    """What the tests expect of this bake's backend (tests/backend_facts.py)."""
    return backend_facts


@pytest.fixture(scope="session")
def device() -> Any:
{%- if cookiecutter.backend == "torch_tpu" %}
    """The device the in-process tests share: the CPU (TorchTPU's device on a TPU only)."""
    from {{ cookiecutter.package_name }}.core import runtime

    runtime.configure("cpu")
    return runtime.device()
{%- else %}
    """The single XLA:CPU device the in-process tests share."""
    import torch_xla

    return torch_xla.device()
{%- endif %}


@pytest.fixture
def step_guard(device: Any) -> Callable[..., Any]:
    """Build the backend's `StepGuard`: `with step_guard(): ...` fails on a graph compiled
    in the block, a CPU fallback or a device read.

    Pending work is cut when the block starts and again inside it at the end, so each
    compilation is charged to the code that caused it. Warm the code up before the block.
    """
    from {{ cookiecutter.package_name }}.core import StepGuard

    def make(allowed_transfers: int = 0) -> Any:
        return StepGuard(allowed_transfers=allowed_transfers, sync=True)

    return make


@pytest.fixture(scope="session")
def compiled(device: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`compiled(fn)`: `fn` run as the backend runs a training step, as a compiled graph
{%- if cookiecutter.backend == "torch_tpu" %}
    (`torch.compile`, static shapes, the backend's compile backend).
    """
    import torch

    from {{ cookiecutter.package_name }}.core.replay import compile_backend

    def compile_(fn: Callable[..., Any]) -> Callable[..., Any]:
        return torch.compile(fn, backend=compile_backend(), dynamic=False)  # type: ignore[no-any-return]
{%- else %}
    (torch_xla traces it lazily and compiles the graph when the step's work is cut).
    """

    def compile_(fn: Callable[..., Any]) -> Callable[..., Any]:
        return fn
{%- endif %}

    return compile_


@pytest.fixture(scope="session")
def child_environ() -> dict[str, str]:
    """What the fresh interpreters of the tests set over this one's environment."""
    return dict(backend_facts.CHILD_ENV)
