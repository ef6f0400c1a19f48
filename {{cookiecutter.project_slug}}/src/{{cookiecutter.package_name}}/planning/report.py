"""The plan as a reader sees it (rich tables and verdicts) and as a script reads it (JSON)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from ..core.memory import human
from ..core.sharding import mesh_text
from .estimate import Accelerator, Estimate
from .host_memory import HostMemory, Tensor

MODES = {False: "without_checkpointing", True: "with_checkpointing"}


@dataclass(frozen=True)
class GenerationPlan:
    """`generate`'s bytes per device: the key/value cache of its slots, and the parameters."""

    slots: int
    max_length: int
    cache_bytes: int
    parameter_bytes: int
    usable_bytes: int

    @property
    def fits(self) -> bool:
        return self.cache_bytes + self.parameter_bytes <= self.usable_bytes


@dataclass(frozen=True)
class Plan:
    """Everything `plan` found: the request, its estimate and the smallest slices that fit."""

    model: str
    parameters: str  # `parameters: 8.03B trainable of 8.03B (100.00%)`
    parameter_count: int  # every parameter's elements, a tied tensor once
    active_parameter_count: int | None  # a mixture of experts': what one token uses
    blocks: int  # repeated blocks: what activation checkpointing recomputes
    precision: str
    optimizer: str
    tokens_per_sample: int | None
    accelerator: Accelerator
    margin: float
    estimate: Estimate
    smallest: dict[bool, tuple[str, Estimate] | None]  # by activation checkpointing
    proposed: dict[bool, Estimate | None]  # the first layout of this slice that fits
    host: HostMemory  # each host's RAM while the model is loaded and exported
    generation: GenerationPlan | None = None  # `plan --slots`: generate's cache

    @property
    def usable_bytes(self) -> int:
        """The device's HBM less the margin left for what the estimate leaves out."""
        return int(self.accelerator.hbm_bytes_per_device * (1 - self.margin))

    def fits(self, checkpointed: bool) -> bool:
        return self.estimate.total(checkpointed) <= self.usable_bytes

    def axis_to_grow(self, checkpointed: bool) -> str | None:
        """Where a run that does not fit should spread next: `context` when the activations
        (which grow with the sequence) outweigh the state, `fsdp` when the state does; None
        when it fits."""
        if self.fits(checkpointed):
            return None
        estimate = self.estimate
        activations = estimate.peak_activations(checkpointed)
        return "context" if activations > estimate.total(checkpointed) - activations else "fsdp"


def as_json(plan: Plan) -> dict[str, Any]:
    estimate = plan.estimate
    return {
        "generation": None
        if plan.generation is None
        else {
            "slots": plan.generation.slots,
            "max_length": plan.generation.max_length,
            "cache_bytes_per_device": plan.generation.cache_bytes,
            "parameter_bytes_per_device": plan.generation.parameter_bytes,
            "fits": plan.generation.fits,
        },
        "model": plan.model,
        "parameters": plan.parameters,
        "parameter_count": plan.parameter_count,
        "active_parameter_count": plan.active_parameter_count,
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
        "grow": {MODES[mode]: plan.axis_to_grow(mode) for mode in MODES},
        "proposed": {
            MODES[mode]: None
            if found is None
            else {
                "mesh": mesh_text(found.mesh),
                "global_batch": found.global_batch,
                "per_device": per_device(found),
            }
            for mode, found in plan.proposed.items()
        },
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
        "host_memory": host_json(plan.host),
    }


def host_json(host: HostMemory) -> dict[str, Any]:
    return {
        "backend": host.backend,
        "hosts": host.hosts,
        "processes_per_host": host.processes,
        "host_bytes": host.host_bytes,
        "usable_host_bytes": host.usable_bytes,
        "baseline_bytes_per_process": host.baseline,
        "loading": {
            **tensor_json(host.loaded),
            "resident_bytes": host.resident,
            "total_bytes": host.loading,
        },
        "exporting": {
            **tensor_json(host.exported),
            "write_buffer_bytes": host.write_buffers,
            "total_bytes": host.exporting,
        },
        "loadable": host.loadable,
        "exportable": host.exportable,
    }


def tensor_json(tensor: Tensor) -> dict[str, Any]:
    return {
        "largest_tensor": tensor.name,
        "shape": list(tensor.shape),
        "tensor_bytes": tensor.read,
        "converted_bytes": tensor.converted,
    }


def per_device(estimate: Estimate) -> dict[str, int]:
    return {
        "param_bytes": estimate.parameters,
        "gradient_bytes": estimate.gradients,
        "optimizer_bytes": estimate.optimizer,
        "gathered_bytes": estimate.gathered,
        "reference_bytes": estimate.reference,
        "activation_bytes": estimate.activations,
        "activation_bytes_checkpointed": estimate.activations_checkpointed,
        "eval_activation_bytes": estimate.eval_activations,
        "total_bytes": estimate.total(False),
        "total_bytes_checkpointed": estimate.total(True),
    }


def print_plan(plan: Plan, console: Console | None = None) -> None:
    """The request, a table of bytes per device both ways to train, the verdicts and the
    smallest slices that fit."""
    console = console or Console()
    estimate, accelerator = plan.estimate, plan.accelerator
    tokens = f", {plan.tokens_per_sample} tokens per sample" if plan.tokens_per_sample else ""
    console.print(
        f"plan: {plan.model}; {plan.parameters}", markup=False, highlight=False, soft_wrap=True
    )
    console.print(
        f"{plan.precision}, {plan.optimizer}{tokens}; global batch {estimate.global_batch}, "
        f"{estimate.samples_per_shard} sample(s) per device of the data axes; "
        f"evaluation {estimate.eval_samples_per_shard}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    table = Table(
        title=f"{accelerator.type}: {accelerator.devices} devices of "
        f"{human(accelerator.hbm_bytes_per_device)} HBM; mesh {mesh_text(estimate.mesh)}",
        title_justify="left",
    )
    table.add_column("per device")
    table.add_column("no checkpointing", justify="right")
    table.add_column("act. checkpointing", justify="right")
    rows = [
        ("parameters", estimate.parameters, estimate.parameters),
        ("gradients", estimate.gradients, estimate.gradients),
        ("optimizer state", estimate.optimizer, estimate.optimizer),
        ("fsdp gathered block", estimate.gathered, estimate.gathered),
        ("activations (model)", estimate.activations, estimate.activations_checkpointed),
        ("evaluation forward", estimate.eval_activations, estimate.eval_activations),
    ]
    if estimate.reference:
        rows.insert(4, ("dpo frozen reference", estimate.reference, estimate.reference))
    for name, plain, checkpointed in rows:
        table.add_row(name, human(plain), human(checkpointed))
    table.add_section()
    table.add_row("total", *(human(estimate.total(mode)) for mode in MODES), style="bold")
    usable = human(plan.usable_bytes)
    table.add_row(f"usable ({1 - plan.margin:.0%} of HBM)", usable, usable)
    table.add_row("verdict", *(_verdict(plan.fits(mode)) for mode in MODES))
    console.print(table)
    if not plan.blocks:
        console.print(
            "(the model names no repeated block: activation checkpointing does not apply)"
        )
    generation = accelerator.generation.key
    for mode, label in ((False, "no checkpointing"), (True, "activation checkpointing")):
        grow = plan.axis_to_grow(mode)
        proposed = plan.proposed[mode]
        if grow is None:
            continue
        text = f"does not fit ({label}): grow the {grow} axis" + (
            f"; on {accelerator.type}, mesh {mesh_text(proposed.mesh)} fits with "
            f"{human(proposed.total(mode))} per device (global batch {proposed.global_batch})"
            if proposed is not None
            else f"; no layout of {accelerator.type} fits"
        )
        console.print(text, markup=False, highlight=False, soft_wrap=True)
    for mode, label in ((False, "no checkpointing"), (True, "activation checkpointing")):
        found = plan.smallest[mode]
        text = "none" if found is None else (
            f"{found[0]}, mesh {mesh_text(found[1].mesh)}, global batch {found[1].global_batch}, "
            f"{human(found[1].total(mode))} per device"
        )  # fmt: skip
        console.print(
            f"smallest {generation} slice that fits ({label}): {text}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    if plan.generation is not None:
        print_generation(plan.generation, console)
    print_host(plan, console)


def print_generation(generation: GenerationPlan, console: Console) -> None:
    total = generation.cache_bytes + generation.parameter_bytes
    console.print(
        f"generation: {generation.slots} slots of {generation.max_length} tokens: key/value "
        f"cache {human(generation.cache_bytes)} + parameters {human(generation.parameter_bytes)}"
        f" = {human(total)} per device of {human(generation.usable_bytes)} usable: "
        + ("fits" if generation.fits else "does not fit"),
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def print_host(plan: Plan, console: Console) -> None:
    """The RAM each host needs while the model is loaded and while it is exported."""
    host, accelerator = plan.host, plan.accelerator
    ram = "RAM unknown" if host.host_bytes is None else f"{human(host.host_bytes)} RAM"
    table = Table(title=f"{accelerator.type}: {host.hosts} host(s) of {ram}", title_justify="left")
    table.add_column("per host")
    table.add_column("loading", justify="right")
    table.add_column("exporting", justify="right")
    rows = [
        ("processes", str(host.processes), "1"),
        ("process baseline", human(host.baseline), human(host.baseline)),
        ("largest tensor", human(host.loaded.read), human(host.exported.read)),
        ("  converted", human(host.loaded.converted), human(host.exported.converted)),
        ("write buffers", "-", human(host.write_buffers)),
        ("kept in host memory", human(host.resident), "-"),
    ]
    for row in rows:
        table.add_row(*row)
    table.add_section()
    table.add_row("total", human(host.loading), human(host.exporting), style="bold")
    usable = "unknown" if host.usable_bytes is None else human(host.usable_bytes)
    table.add_row(f"usable ({1 - host.margin:.0%} of RAM)", usable, usable)
    table.add_row("verdict", _host_verdict(host.loadable), _host_verdict(host.exportable))
    console.print(table)
    shape = "x".join(map(str, host.loaded.shape))
    each = "process" if host.processes == 1 else "processes"
    lines = [
        f"{host.backend}: {host.processes} {each} per host; largest tensor {host.loaded.name} "
        f"[{shape}]; process baseline measured on XLA:CPU/CPU"
    ]
    if host.host_bytes is None:
        generation = accelerator.generation
        lines.append(f"{generation.name}: host RAM {generation.host_ram_note}")
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def _verdict(fits: bool) -> str:
    return "[green]fits[/green]" if fits else "[bold red]does not fit[/bold red]"


def _host_verdict(fits: bool | None) -> str:
    return "unknown" if fits is None else _verdict(fits)
