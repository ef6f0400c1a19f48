"""Shared fixtures: one XLA:CPU device in this process, fresh interpreters for the rest."""

import os
from collections.abc import Callable
from typing import Any

import pytest

# Fixtures `gcs_emulator` and `gcs_bucket`: a local GCS server for `gs://` checkpoints;
# `python_subprocess`, `restore_environ` and `gated_src` (tests/subprocess_fixtures.py).
pytest_plugins = ["gcs_emulator", "subprocess_fixtures"]

# The XLA runtime reads PJRT_DEVICE once, when it starts: set it before any test touches it.
os.environ.setdefault("PJRT_DEVICE", "CPU")
# No test reaches W&B's servers: a run that logs to W&B writes its files for `wandb sync`.
os.environ["WANDB_MODE"] = "offline"


@pytest.fixture(scope="session")
def xla_device() -> Any:
    """The single XLA:CPU device the in-process tests share."""
    import torch_xla

    return torch_xla.device()


@pytest.fixture
def xla_guard(xla_device: Any) -> Callable[..., Any]:
    """Build an `XlaGuard`: `with xla_guard(): ...` fails on a new graph, fallback or sync.

    Pending work is cut when the block starts and again inside it at the end, so each
    compilation is charged to the code that caused it. Warm the code up before the block.
    """
    from {{ cookiecutter.package_name }}.core import XlaGuard

    def make(allowed_transfers: int = 0) -> Any:
        return XlaGuard(allowed_transfers=allowed_transfers, sync=True)

    return make


@pytest.fixture(scope="session")
def child_environ() -> dict[str, str]:
    """Runs in fresh interpreters use XLA:CPU too, whatever the shell's PJRT_DEVICE says."""
    return {"PJRT_DEVICE": "CPU"}
