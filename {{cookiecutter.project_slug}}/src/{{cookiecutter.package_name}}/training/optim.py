"""Optimizers and learning-rate schedules from the config (or the task's own optimizer)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn

from ..core import ops
from .errors import ConfigError


class OptimizerSettings(Protocol):
    """The config keys an optimizer and its schedule are built from (a TrainConfig's)."""

    optimizer: str
    lr: float
    weight_decay: float
    optimizer_options: dict[str, Any]
    schedule: str
    warmup_steps: int


class Adafactor(torch.optim.Adafactor):
    """torch's Adafactor with every per-step scalar computed on the device.

    torch.optim.Adafactor reads each parameter's and each update's norm to the host
    (`.item()`) and derives its decay from a host step count; on XLA each read cuts the
    step's graph, and the first step's decay of exactly 1.0 becomes a constant of a
    graph of its own. Here the step count lives beside the parameter and the clamps
    run on the device: one graph for every step. The math, the hyperparameters and the
    state names (`step`, `row_var`, `col_var`, `variance`) are torch's. The learning
    rate may be a device scalar: a replayed step feeds it as an input.
    """

    takes_device_lr = True

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr = group["lr"]
            eps1, eps2 = group["eps"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = -param.grad if group["maximize"] else param.grad
                state = self.state[param]
                if not state:
                    _init_state(state, grad)
                step = state["step"].add_(1)
                # In the state's dtype (the gradient's, as torch's Adafactor keeps it):
                # lerp_ takes no fp32 weight for bf16 tensors under bf16-true.
                one_minus_beta2 = step.pow(group["beta2_decay"]).to(grad.dtype)
                rho = step.rsqrt().clamp(max=lr)
                floor = eps1 if eps1 is not None else torch.finfo(param.dtype).eps
                scale = (param.norm(2) / param.numel() ** 0.5).clamp(min=eps2) * rho
                if group["weight_decay"]:
                    param.mul_(1 - lr * group["weight_decay"])
                if grad.dim() > 1:
                    row = grad.norm(dim=-1, keepdim=True).square_().div_(grad.size(-1))
                    state["row_var"].lerp_(row, one_minus_beta2)
                    col = grad.norm(dim=-2, keepdim=True).square_().div_(grad.size(-2))
                    state["col_var"].lerp_(col, one_minus_beta2)
                    estimate = state["row_var"] @ state["col_var"]
                    estimate.div_(state["row_var"].mean(dim=-2, keepdim=True).clamp_(min=floor))
                else:
                    state["variance"].lerp_(grad * grad, one_minus_beta2)
                    estimate = state["variance"].clone()
                update = estimate.clamp_(min=floor * floor).rsqrt_().mul_(grad)
                rms = update.norm(2) / (update.numel() ** 0.5 * group["d"])
                param.sub_(update * (scale / rms.clamp(min=1.0)))
        return loss


def _init_state(state: dict[str, Any], grad: torch.Tensor) -> None:
    """The state torch's Adafactor creates for a parameter, its step beside the parameter."""
    state["step"] = torch.zeros((), dtype=torch.float32, device=grad.device)
    if grad.dim() > 1:
        row, col = list(grad.shape), list(grad.shape)
        row[-1], col[-2] = 1, 1
        state["row_var"] = grad.new_zeros(row)
        state["col_var"] = grad.new_zeros(col)
    else:
        state["variance"] = torch.zeros_like(grad)


OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
    "rmsprop": torch.optim.RMSprop,
    "adafactor": Adafactor,
}
SCHEDULES = ("cosine", "linear", "constant")


def counts_on_device(config: OptimizerSettings, task: Any = None) -> bool:
    """Whether the run's optimizer keeps its step counts on the device: AdamW, made
    capturable on XLA (its step count and bias corrections computed there, so a replayed
    step needs no host number but the learning rate, which it takes as an input)."""
    if callable(getattr(task, "configure_optimizer", None)):
        return False  # the task's own: as it builds it
    adamw = OPTIMIZERS[config.optimizer] is torch.optim.AdamW
    return adamw and bool(config.optimizer_options.get("capturable", True))


def build_optimizer(
    model: nn.Module, config: OptimizerSettings, task: Any = None
) -> torch.optim.Optimizer:
    """The task's `configure_optimizer(model, config)` if it has one, else `config.optimizer`."""
    hook = getattr(task, "configure_optimizer", None)
    if callable(hook):
        optimizer = hook(model, config)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(
                f"configure_optimizer returned {type(optimizer).__name__}, not a torch optimizer"
            )
        return optimizer
    kind = OPTIMIZERS[config.optimizer]
    options: dict[str, Any] = {"lr": config.lr, "weight_decay": config.weight_decay}
    trainable = [param for param in model.parameters() if param.requires_grad]  # not a frozen base
    if counts_on_device(config) and trainable and ops.traced_lazily(trainable[0]):
        options["capturable"] = True
    options.update(config.optimizer_options)
    try:
        return kind(trainable, **options)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"optimizer {config.optimizer!r}: {error}") from None


def lr_lambda(schedule: str, warmup: int, total: int) -> Callable[[int], float]:
    """Linear warm-up, then cosine/linear decay to 10% (or constant)."""

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "linear":
            return 1.0 - 0.9 * progress
        return 0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))

    return factor


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: OptimizerSettings, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(config.schedule, config.warmup_steps, total_steps)
    )
