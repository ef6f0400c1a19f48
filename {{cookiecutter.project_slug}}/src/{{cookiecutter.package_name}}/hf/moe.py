"""Mixture-of-experts decoders: static experts, the router's loss in training, its numbers.

`prepare_experts` (run by `hf.prepare` for every transformers model) gives a model whose
experts go through transformers' experts interface the static "xla" experts (`experts.py`)
with the run's `[moe]` settings, and while gradients are recorded asks it for its router
logits: transformers then returns the load-balancing loss (`aux_loss`) each MoE model
defines. It also passes an all-ones attention mask when the caller gives none, because
transformers counts each expert's tokens with `torch.bincount` without a mask (XLA has no
lowering: a host round trip every step) and with `scatter_add` given one. Llama 4's
mixture layers, which compute their experts outside the interface (densely, over every
expert), are made to call the static experts themselves (`llama4.py`); another model that
declares experts but computes them some other way (older remote code) is refused.

`add_router_loss` is what a task adds to its loss; `router_metrics` are device scalars of
the last forward the training loop logs with the loss, in the same transfer.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from .common import HFConfigError, unwrap
from .experts import LOADS, NAME, SETTINGS, Routing, register

AUX = "_xla_router_aux_loss"  # the last training forward's aux loss (detached)
EXPERTS = "_xla_experts"  # the model's experts modules, found once
HOOKED = "_xla_router_hooks"
# Config fields that say a model has experts (dbrx keeps its count in ffn_config).
EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok")


@dataclass(frozen=True)
class MoeSettings:
    """The `[moe]` table: capacity (0: dropless), the TPU kernel, the aux loss's weight."""

    capacity_factor: float = 1.25
    grouped_matmul: bool = True
    router_aux_loss_coef: float | None = None  # None: the model's own (its config's)

    @classmethod
    def from_dict(cls, table: dict[str, Any]) -> MoeSettings:
        """The `[moe]` table's settings; HFConfigError names an unknown or bad key."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(table) - known)
        if unknown:
            raise HFConfigError(
                f"unknown moe option {unknown[0]!r}: moe takes {', '.join(sorted(known))}"
            )
        try:
            settings = cls(**table)
            factor = float(settings.capacity_factor)
            coef = settings.router_aux_loss_coef
            coef = None if coef is None else float(coef)
        except (TypeError, ValueError) as error:
            raise HFConfigError(f"moe: {error}") from None
        if factor < 0 or (coef is not None and coef < 0):
            raise HFConfigError(
                "moe.capacity_factor (0: dropless) and moe.router_aux_loss_coef must not be "
                f"negative, got {settings.capacity_factor} and {settings.router_aux_loss_coef}"
            )
        return cls(factor, bool(settings.grouped_matmul), coef)


def experts_modules(model: nn.Module) -> list[nn.Module]:
    """The modules that compute experts through transformers' experts interface (found once
    per model: the training step asks every step)."""
    found = getattr(model, EXPERTS, None)
    if found is None:
        inner = unwrap(model)
        # The `use_experts_implementation` decorator sets these in each instance's __init__
        # (in its own __dict__: a wrapper forwarding attributes to it, as peft's, is not one).
        modules = inner.modules() if inner is not None else ()
        found = [m for m in modules if {"_is_expert_parallel", "has_gate"} <= vars(m).keys()]
        setattr(model, EXPERTS, found)  # a plain list: not a submodule, not in the state
    return list(found)


def declares_experts(config: Any) -> bool:
    counts = [getattr(config, name, None) for name in EXPERT_COUNTS]
    ffn = getattr(config, "ffn_config", None)
    counts.append(getattr(ffn, "moe_num_experts", None))
    return any(isinstance(n, int) and n > 1 for n in counts)


def prepare_experts(model: nn.Module, settings: MoeSettings | None = None) -> None:
    """Static experts, router logits while training, the aux loss kept (idempotent)."""
    inner = unwrap(model)
    if inner is None:
        return
    llama4 = _llama4(inner)
    if llama4 is not None:  # its experts join the interface's: found again
        llama4.adopt(inner)
        for holder in (model, inner):
            vars(holder).pop(EXPERTS, None)
    experts = experts_modules(model)
    if not experts:
        if declares_experts(inner.config):
            raise HFConfigError(
                f"{type(inner).__name__} computes its experts outside transformers' experts "
                "interface (@use_experts_implementation), where their shapes cannot be made "
                "static (such code may read the device every step): use a mixture transformers "
                "runs through it (mixtral, qwen2_moe, qwen3_moe, olmoe, ...) or Llama 4"
            )
        return
    settings = settings or MoeSettings()
    routing = Routing(settings.capacity_factor, settings.grouped_matmul)
    for module in experts:
        setattr(module, SETTINGS, routing)
    if llama4 is not None:  # its layers call the static experts themselves
        if settings.router_aux_loss_coef:
            raise HFConfigError(
                f"moe.router_aux_loss_coef = {settings.router_aux_loss_coef}: transformers' "
                "Llama 4 defines no load-balancing loss to weigh; remove it"
            )
        return
    register()
    inner.set_experts_implementation(NAME)
    if settings.router_aux_loss_coef is not None:
        inner.router_aux_loss_coef = settings.router_aux_loss_coef  # what transformers reads
    if not getattr(inner, HOOKED, False):
        inner.register_forward_pre_hook(_ask_for_router_logits, with_kwargs=True)
        inner.register_forward_hook(_keep_aux_loss)
        setattr(inner, HOOKED, True)


def _llama4(model: nn.Module) -> Any:
    """The `llama4` module when `model` holds Llama 4 mixture layers (their transformers
    module is then loaded), else None."""
    if "transformers.models.llama4.modeling_llama4" not in sys.modules:
        return None
    from . import llama4

    return llama4 if llama4.has_llama4_experts(model) else None


def _ask_for_router_logits(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    if not torch.is_grad_enabled():  # evaluation and generation: no loss to balance
        return None
    kwargs = dict(kwargs)
    if kwargs.get("output_router_logits") is None:
        kwargs["output_router_logits"] = True
    if kwargs.get("attention_mask") is None and len(args) < 2:
        shaped = kwargs.get("input_ids", args[0] if args else None)
        if shaped is None:
            shaped = kwargs["inputs_embeds"][..., 0]
        kwargs["attention_mask"] = torch.ones(
            shaped.shape[:2], dtype=torch.long, device=shaped.device
        )
    return args, kwargs


def _keep_aux_loss(module: nn.Module, args: Any, output: Any) -> None:
    aux = getattr(output, "aux_loss", None)
    if isinstance(aux, torch.Tensor):
        setattr(module, AUX, aux.detach())


def router_coefficient(model: nn.Module) -> float:
    """The aux loss's weight in the training loss: `[moe]`'s, else the model's config's."""
    coef = getattr(model, "router_aux_loss_coef", None)  # the model's (peft forwards to it)
    if coef is None:
        coef = getattr(unwrap(model).config, "router_aux_loss_coef", 0.0)
    return float(coef or 0.0)


def add_router_loss(loss: torch.Tensor, model: nn.Module, output: Any) -> torch.Tensor:
    """`loss` plus the router's load-balancing loss times its coefficient, when the forward
    that made `output` computed one (a MoE model while training); else `loss` itself."""
    aux = getattr(output, "aux_loss", None)
    if not isinstance(aux, torch.Tensor):
        return loss
    return loss + router_coefficient(model) * aux.to(loss.dtype)


def router_metrics(model: nn.Module) -> dict[str, torch.Tensor]:
    """Device scalars of the last forward: the aux loss, the busiest expert's tokens over
    the mean (the worst layer's), and the share of routed (token, expert) pairs dropped."""
    # Taken, not read: a step keeps no tensor of its own once it has returned its numbers
    # (a replayed step would leave it stale, so the step could not be replayed).
    found = (vars(m).pop(LOADS, None) for m in experts_modules(model))
    loads = [load for load in found if load is not None]
    if not loads:
        return {}
    counts = torch.stack([tokens for tokens, _ in loads]).float()  # [layers, experts]
    kept = torch.stack([kept for _, kept in loads]).float().sum()
    metrics: dict[str, torch.Tensor] = {}
    # On the transformers model, under peft's wrapper when there is one.
    aux = vars(model).pop(AUX, None)
    if aux is None:
        aux = vars(unwrap(model)).pop(AUX, None)
    if aux is not None:
        metrics["router_aux_loss"] = aux.float()
    # `.max()`: torch_xla 2.9 reduces nothing under `.amax()` without dims.
    metrics["expert_load_max"] = (counts.amax(dim=1) / counts.mean(dim=1)).max()
    metrics["tokens_dropped"] = 1.0 - kept / counts.sum()
    return metrics


def drop_router_numbers(model: nn.Module) -> None:
    """Forget the last forward's router counts: a forward whose numbers nobody logs
    (generation) must leave no tensor behind (a compiled step keeps none of its own)."""
    for module in experts_modules(model):
        vars(module).pop(LOADS, None)


def active_parameters(model: nn.Module) -> int | None:
    """Parameters one token uses: all but the experts it is not routed to (None: no experts)."""
    experts = experts_modules(model)
    if not experts:
        return None
    inner = unwrap(model)
    top_k = int(inner.config.num_experts_per_tok)
    total = sum(p.numel() for p in model.parameters())
    idle = 0.0
    for module in experts:
        weights = list(module.parameters(recurse=False))  # each [experts, ...]
        if not weights:
            continue
        share = 1.0 - top_k / weights[0].shape[0]
        adapters = expert_adapters(model, module)  # LoRA on the stacked weights: per expert
        idle += share * sum(p.numel() for p in [*weights, *adapters])
    return total - round(idle)


def expert_adapters(model: nn.Module, experts: nn.Module) -> list[nn.Parameter]:
    """The LoRA parameters of the wrappers peft puts around an experts module (one per
    stacked weight, `target_parameters`): their rank dimension is split over the experts."""
    found = []
    for module in model.modules():
        inner: Any = module
        while hasattr(inner, "base_layer") and inner is not experts:
            inner = inner.base_layer
        if inner is experts and module is not experts:
            for part in ("lora_A", "lora_B"):
                adapters = getattr(module, part, None)
                if isinstance(adapters, nn.ModuleDict):
                    found += [p for a in adapters.values() for p in a.parameters()]
    return found
