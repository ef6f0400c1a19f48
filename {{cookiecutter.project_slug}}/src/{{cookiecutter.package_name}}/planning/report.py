"""The plan as a reader sees it (a table and a verdict) and as a script reads it (JSON)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.memory import human
from ..core.sharding import mesh_text
from .estimate import Accelerator, Estimate

MODES = {False: "without_checkpointing", True: "with_checkpointing"}


@dataclass(frozen=True)
class Plan:
    """Everything `plan` found: the request, its estimate and the smallest slices that fit."""

    model: str
    parameters: str  # `parameters: 8.03B trainable of 8.03B (100.00%)`
    blocks: int  # repeated blocks: what activation checkpointing recomputes
    precision: str
    optimizer: str
    tokens_per_sample: int | None
    accelerator: Accelerator
    margin: float
    estimate: Estimate
    smallest: dict[bool, tuple[str, Estimate] | None]  # by activation checkpointing

    @property
    def usable_bytes(self) -> int:
        """The device's HBM less the margin left for what the estimate leaves out."""
        return int(self.accelerator.hbm_bytes_per_device * (1 - self.margin))

    def fits(self, checkpointed: bool) -> bool:
        return self.estimate.total(checkpointed) <= self.usable_bytes


def as_json(plan: Plan) -> dict[str, Any]:
    estimate = plan.estimate
    return {
        "model": plan.model,
        "parameters": plan.parameters,
        "blocks": plan.blocks,
        "precision": plan.precision,
        "optimizer": plan.optimizer,
        "tokens_per_sample": plan.tokens_per_sample,
        "accelerator_type": plan.accelerator.type,
        "devices": plan.accelerator.devices,
        "hbm_bytes_per_device": plan.accelerator.hbm_bytes_per_device,
        "margin": plan.margin,
        "usable_bytes_per_device": plan.usable_bytes,
        "mesh": mesh_text(estimate.mesh),
        "global_batch": estimate.global_batch,
        "samples_per_device": estimate.samples_per_shard,
        "per_device": per_device(estimate),
        "fits": {MODES[mode]: plan.fits(mode) for mode in MODES},
        "smallest": {
            MODES[mode]: None
            if found is None
            else {
                "accelerator_type": found[0],
                "mesh": mesh_text(found[1].mesh),
                "global_batch": found[1].global_batch,
                "per_device": per_device(found[1]),
            }
            for mode, found in plan.smallest.items()
        },
    }


def per_device(estimate: Estimate) -> dict[str, int]:
    return {
        "param_bytes": estimate.parameters,
        "gradient_bytes": estimate.gradients,
        "optimizer_bytes": estimate.optimizer,
        "gathered_bytes": estimate.gathered,
        "activation_bytes": estimate.activations,
        "activation_bytes_checkpointed": estimate.activations_checkpointed,
        "total_bytes": estimate.total(False),
        "total_bytes_checkpointed": estimate.total(True),
    }


def as_text(plan: Plan) -> str:
    estimate, accelerator = plan.estimate, plan.accelerator
    tokens = f", {plan.tokens_per_sample} tokens per sample" if plan.tokens_per_sample else ""
    lines = [
        f"plan: {plan.model}; {plan.parameters}",
        f"{plan.precision}, {plan.optimizer}{tokens}; global batch {estimate.global_batch}, "
        f"{estimate.samples_per_shard} sample(s) per device",
        f"{accelerator.type}: {accelerator.devices} devices of "
        f"{human(accelerator.hbm_bytes_per_device)} HBM; mesh {mesh_text(estimate.mesh)}",
        "",
    ]
    rows = [
        ("parameters", estimate.parameters, estimate.parameters),
        ("gradients", estimate.gradients, estimate.gradients),
        ("optimizer state", estimate.optimizer, estimate.optimizer),
        ("fsdp gathered block", estimate.gathered, estimate.gathered),
        ("activations", estimate.activations, estimate.activations_checkpointed),
        ("total", estimate.total(False), estimate.total(True)),
        (f"usable ({1 - plan.margin:.0%} of HBM)", plan.usable_bytes, plan.usable_bytes),
    ]
    lines.append(f"{'per device':<24}{'no checkpointing':>20}{'act. checkpointing':>22}")
    lines += [f"{name:<24}{human(a):>20}{human(b):>22}" for name, a, b in rows]
    verdicts = ["fits" if plan.fits(mode) else "does not fit" for mode in MODES]
    lines.append(f"{'verdict':<24}{verdicts[0]:>20}{verdicts[1]:>22}")
    if not plan.blocks:
        lines.append("(the model names no repeated block: activation checkpointing does not apply)")
    lines.append("")
    generation = accelerator.generation.key
    for mode, label in ((False, "no checkpointing"), (True, "activation checkpointing")):
        found = plan.smallest[mode]
        if found is None:
            lines.append(f"smallest {generation} slice that fits ({label}): none")
        else:
            kind, best = found
            lines.append(
                f"smallest {generation} slice that fits ({label}): {kind}, mesh "
                f"{mesh_text(best.mesh)}, global batch {best.global_batch}, "
                f"{human(best.total(mode))} per device"
            )
    return "\n".join(lines)
