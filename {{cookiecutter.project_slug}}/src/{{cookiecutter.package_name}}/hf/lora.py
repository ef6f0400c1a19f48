"""LoRA fine-tuning through `peft`: the base frozen, low-rank adapters trained.

Set in the config's `[lora]` table (or `--set lora.rank=16`); an empty table trains every
weight. The base model's weights stay frozen (in bf16 with `base_bf16 = true`, under
`bf16-mixed`), the optimizer sees only the adapters, and checkpoints hold the adapters
and their optimizer state: the base comes back from the task (its pretrained weights, or
its seeded initialisation) when a run resumes, evaluates or exports.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from .common import HFConfigError
from .moe import experts_modules


@dataclass(frozen=True)
class LoraSettings:
    rank: int = 8
    alpha: int = 16
    dropout: float = 0.0
    # Module names (or name suffixes) that get adapters; "all-linear": every linear layer
    # but the output head.
    target_modules: tuple[str, ...] | str = "all-linear"
    base_bf16: bool = False

    @classmethod
    def from_dict(cls, table: dict[str, Any]) -> LoraSettings:
        """The `[lora]` table's settings; HFConfigError names an unknown or bad key."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(table) - known)
        if unknown:
            raise HFConfigError(
                f"unknown lora option {unknown[0]!r}: lora takes {', '.join(sorted(known))}"
            )
        values = dict(table)
        targets = values.get("target_modules", cls.target_modules)
        if isinstance(targets, str) and targets != "all-linear":
            targets = tuple(t.strip() for t in targets.split(",") if t.strip())
        elif isinstance(targets, list):
            targets = tuple(str(t) for t in targets)
        values["target_modules"] = targets
        try:
            settings = cls(**values)
            rank, alpha, dropout = int(settings.rank), int(settings.alpha), settings.dropout
        except (TypeError, ValueError) as error:
            raise HFConfigError(f"lora: {error}") from None
        if rank < 1 or alpha <= 0 or not 0 <= float(dropout) < 1 or not targets:
            raise HFConfigError(
                "lora needs rank >= 1, alpha > 0, 0 <= dropout < 1 and some target_modules, "
                f"got rank={settings.rank}, alpha={settings.alpha}, dropout={settings.dropout}, "
                f"target_modules={targets!r}"
            )
        return settings

    def check_precision(self, precision: str) -> None:
        if self.base_bf16 and precision != "bf16-mixed":
            raise HFConfigError(
                f"lora.base_bf16 needs precision 'bf16-mixed' (autocast feeds the bf16 base), "
                f"not {precision!r}; under bf16-true every weight is bf16 already"
            )


def apply_lora(model: nn.Module, settings: LoraSettings, precision: str) -> nn.Module:
    """The model with LoRA adapters on its target modules and every other weight frozen."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise HFConfigError(
            "lora needs peft: pip install -e '.[hf]' (or pip install peft)"
        ) from None
    settings.check_precision(precision)
    targets: Any = settings.target_modules
    _check_expert_targets(model, targets)
    routers = _linear_routers(model)
    _check_router_targets(routers, targets)
    config = LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=targets if isinstance(targets, str) else list(targets),
        exclude_modules=sorted(routers) or None,  # from all-linear
    )
    try:
        with quiet_peft_wrapping():
            wrapped = get_peft_model(model, config)
    except ValueError as error:  # peft: "Target modules {...} not found in the base model"
        first = str(error).strip().splitlines()[0]
        raise HFConfigError(f"lora.target_modules {targets!r} match nothing: {first}") from None
    if settings.base_bf16:
        for param in wrapped.parameters():
            if not param.requires_grad and param.is_floating_point():
                param.data = param.data.to(torch.bfloat16)
    return wrapped  # type: ignore[no-any-return]


@contextlib.contextmanager
def quiet_peft_wrapping() -> Iterator[None]:
    """Silence the warnings a LoRA run would print and no user can act on.

    peft reads `model.is_gradient_checkpointing` when it wraps a model; transformers 5.23
    deprecated that property with a FutureWarning on each read. Other warnings pass.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
        )
        # peft (0.19) gives a mixture's stacked expert weights (`target_parameters`) their
        # rank through `rank_pattern` / `alpha_pattern`, then checks those patterns against
        # the targeted *modules* only and warns they were ignored: they were not (the
        # adapters have those ranks).
        warnings.filterwarnings(
            "ignore",
            message=r"The following (rank|alpha)_pattern keys did not match any targeted "
            r"module and were ignored: \[[^]]*(gate_up_proj|down_proj|gate_proj|up_proj)",
            category=RuntimeWarning,
        )
        yield


def _check_expert_targets(model: nn.Module, targets: tuple[str, ...] | str) -> None:
    """Refuse targets naming a mixture's experts: stacked [experts, out, in] weights in one
    module, not Linear layers, which peft's `target_modules` cannot wrap."""
    experts = experts_modules(model)
    if not experts or isinstance(targets, str):
        return
    ids = {id(module) for module in experts}
    leaves = {id(m): name.rsplit(".", 1)[-1] for name, m in model.named_modules()}
    names = {leaves[i] for i in ids}
    names |= {name for module in experts for name, _ in module.named_parameters(recurse=False)}
    names -= {leaf for i, leaf in leaves.items() if i not in ids}  # e.g. a shared expert's
    for target in targets:
        if target.rsplit(".", 1)[-1] in names:
            raise HFConfigError(
                f"lora.target_modules {target!r} names {type(experts[0]).__name__}'s stacked "
                "expert weights, which peft cannot wrap as target modules (they are not Linear "
                "layers): target the attention projections (q_proj, k_proj, v_proj, o_proj), "
                "or 'all-linear'"
            )


def _linear_routers(model: nn.Module) -> dict[str, str]:
    """The routers (what transformers records router logits from) that are Linear layers with
    a forward of their own, which returns more than their output (Llama 4's: its scores and
    logits) for a LoRA layer to add to: name -> class name."""
    kinds: set[type[nn.Linear]] = set()
    for module in model.modules():
        recorded = (getattr(module, "_can_record_outputs", None) or {}).get("router_logits")
        kind = getattr(recorded, "target_class", recorded)
        if isinstance(kind, type) and issubclass(kind, nn.Linear):
            kinds.add(kind)
    return {
        name: type(module).__name__
        for name, module in model.named_modules()
        if type(module) in kinds and type(module).forward is not nn.Linear.forward
    }


def _check_router_targets(routers: dict[str, str], targets: tuple[str, ...] | str) -> None:
    """Refuse targets naming such a router (`all-linear` leaves them out)."""
    if isinstance(targets, str):
        return
    for target in targets:
        leaf = target.rsplit(".", 1)[-1]
        found = [kind for name, kind in routers.items() if name.rsplit(".", 1)[-1] == leaf]
        if found:
            raise HFConfigError(
                f"lora.target_modules {target!r} names {found[0]}, a router whose forward returns "
                "more than a Linear layer's output (a LoRA layer adds to that output): target "
                "the attention projections (q_proj, k_proj, v_proj, o_proj), or 'all-linear', "
                "which leaves it out"
            )


def is_lora(model: nn.Module) -> bool:
    """True for a model with peft adapters (its checkpoints hold only what trains)."""
    if "peft" not in sys.modules:
        return False  # nothing made adapters: peft's import (seconds) would find none
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return any(isinstance(module, PeftModel) for module in model.modules())


def merged(model: nn.Module) -> nn.Module:
    """The base model with the adapters folded into its weights (for export)."""
    peft_model = next(m for m in model.modules() if type(m).__name__.startswith("Peft"))
    return peft_model.merge_and_unload()  # type: ignore[no-any-return,operator]


PEFT_PREFIX = "base_model.model."  # where peft's wrapper puts the base model


def base_name(name: str) -> str:
    """A parameter's name in the base model (a pretrained checkpoint's): without peft's
    wrapper prefix and a LoRA layer's `base_layer`; other names as they are."""
    return name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")
