"""A run builds its model without memory: on the meta device, laid out, then each device's
shards initialized per module, seeded: the same weights on any mesh."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from {{ cookiecutter.package_name }}.tasks import load_task
from {{ cookiecutter.package_name }}.training import build_config
from {{ cookiecutter.package_name }}.training.model import WHOLE, build, build_model

from training_helpers import QUIET, TINY
{% if cookiecutter.backend == "torch_tpu" %}
LAYOUTS = {"one device": ("1", "single", ""), "fsdp x4": ("4", "fsdp", ""),
           "fsdp x tensor 2x2": ("4", "fsdp", "fsdp=2,tensor=2")}  # fmt: skip
{%- else %}
LAYOUTS = {"one device": ("1", "single", ""), "fsdp x8": ("8", "fsdp", ""),
           "fsdp x tensor 4x2": ("8", "fsdp", "fsdp=4,tensor=2")}  # fmt: skip
{%- endif %}


def initial_weights(devices: str, strategy: str, mesh: str) -> dict[str, Any]:
    """Every parameter's digest and sum as a run lays it out and fills it (child process)."""
    from {{ cookiecutter.package_name }}.core import launch
    from {{ cookiecutter.package_name }}.training import plan_of

    settings = {**TINY, **QUIET, "devices": devices, "strategy": strategy, "mesh": mesh,
                "seed": 5}  # fmt: skip
    config = build_config(None, settings)
    plan = plan_of(config)
    return dict(launch(laid_out_digests, plan, (config,)))


def laid_out_digests(config: Any) -> dict[str, Any]:
    from {{ cookiecutter.package_name }}.tasks import block_class
    from {{ cookiecutter.package_name }}.training import plan_of
    from {{ cookiecutter.package_name }}.training.model import sharding_rules

    strategy = plan_of(config).strategy
    task = load_task(config.task, config.data, config.task_options)
    built = build(task, config)
    rules = sharding_rules(task, built.model, config, strategy)
    model, ties = strategy.setup_model(
        built.model, block_class(task, built.model), False, rules, built.source
    )
    digests = {}
    for name, tensor in strategy.model_state_dict(model).items():
        whole = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        values = whole.detach().float().cpu().contiguous()
        digests[name] = hashlib.sha256(values.numpy().tobytes()).hexdigest()
    return {"digests": digests, "ties": ties.to_dict(), "note": built.note,
            "meta": built.source is not None}  # fmt: skip


@pytest.fixture(scope="module")
def layouts(python_subprocess: Any) -> dict[str, dict[str, Any]]:
    return {name: python_subprocess([__file__, *args], env={}) for name, args in LAYOUTS.items()}


@pytest.mark.slow
def test_the_same_seed_gives_the_same_weights_on_every_mesh(
    layouts: dict[str, dict[str, Any]],
) -> None:
    """It initializes each module from its own seeded generator on the host: one device,
    fsdp and fsdp x tensor hold the same values, bit for bit, with the ties kept."""
    reference = layouts["one device"]
    assert reference["meta"] and not reference["note"], reference
    assert reference["digests"], reference
    for name, found in layouts.items():
        assert found["meta"], name
        assert found["digests"] == reference["digests"], name
        assert found["ties"] == reference["ties"], name


def test_meta_build_draws_what_the_whole_build_draws() -> None:
    """It gives every tensor the distribution the model's own initialization gives it
    (the same samples cannot be: each module has its own generator) and the same
    deterministic values (norms' ones and zeros)."""
    config = build_config(None, {**TINY, **QUIET, "seed": 5})
    task = load_task(config.task, config.data, config.task_options)
    whole = dict(build_model(task, config).named_parameters())
    built = build(task, config)
    assert built.source is not None and not built.note
    for name, param in built.model.named_parameters():
        values = built.source.read(name, tuple(slice(0, n) for n in param.shape), param.dtype)
        reference = whole[name].detach()
        assert values.shape == reference.shape and values.dtype == reference.dtype, name
        if reference.std() == 0:
            assert torch.equal(values, reference), name  # a constant: exactly
            continue
        # Two samples of one distribution: means within five standard errors, spreads
        # within five of their relative standard error.
        spread, n = float(reference.std()), reference.numel()
        assert abs(float(values.mean() - reference.mean())) < 5 * spread * (2 / n) ** 0.5, name
        assert abs(float(values.std()) / spread - 1) < 5 / (2 * n) ** 0.5, name


class Scaled(nn.Module):
    """A module that computes on its weight while it is built (cannot be built on meta)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))
        self.register_buffer("norm", self.weight.detach().norm())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight / self.norm


def test_a_model_that_computes_on_its_weights_is_built_whole_and_says_so() -> None:
    """It builds a model whose constructor derives a buffer from a weight as it always did,
    whole on the host, and says why in one line."""

    class Task:
        def build_model(self) -> nn.Module:
            return Scaled()

    config = build_config(None, {**TINY, **QUIET})
    built = build(Task(), config)  # type: ignore[arg-type]
    assert built.source is None and not built.model.weight.is_meta
    assert built.note.startswith(WHOLE) and "'norm'" in built.note, built.note
    assert "\n" not in built.note


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    print(json.dumps(initial_weights(*sys.argv[1:4])))
