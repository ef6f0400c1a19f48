"""Direct preference optimization as TRL 1.16 defines it: its losses, its metrics, its reference.

Chosen and rejected run as one forward of 2 x batch sequences (the batch's chosen rows, then
its rejected rows); a sequence's log-probability is the sum of its completion tokens'. With
the reference's log-probabilities of the same sequences, `delta = (policy chosen - reference
chosen) - (policy rejected - reference rejected)` and, per pair:

- `sigmoid` (DPO): `-logsigmoid(beta x delta)`;
- `robust` (DPO with label smoothing e, TRL's conservative form):
  `(-(1 - e) logsigmoid(beta x delta) + e logsigmoid(-beta x delta)) / (1 - 2e)`;
- `hinge`: `relu(1 - beta x delta)`;
- `ipo`: `(delta' - 1 / (2 beta))^2`, with each completion's log-ratio divided by its token
  count (TRL's normalization).

The loss is the batch's mean. The metrics are TRL's: `rewards/chosen` and `rewards/rejected`
(`beta x` each log-ratio, the batch's mean), `rewards/accuracies` (the share of pairs whose
chosen reward is the larger), `rewards/margins`, `logps/chosen`, `logps/rejected`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .settings import from_table

LOSSES = ("sigmoid", "robust", "hinge", "ipo")
REFERENCES = ("auto", "adapters-off", "copy")
METRICS = (
    "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
    "logps/chosen", "logps/rejected",
)  # fmt: skip


class DpoError(ValueError):
    """DPO settings no run can use; the message names the key."""


@dataclass(frozen=True)
class DpoSettings:
    """The `[dpo]` table."""

    data: str = ""  # the preference pairs: a .jsonl, .json or .parquet file, local or gs://
    loss_type: str = "sigmoid"
    beta: float = 0.1
    label_smoothing: float = 0.0  # the `robust` loss's
    max_length: int = 512  # tokens of a prompt and its completion, a pair's start kept
    eval_fraction: float = 0.05  # the pairs held out for evaluation
    # The reference: "adapters-off" (the LoRA model with its adapters disabled: no second
    # copy), "copy" (a frozen copy of the base, laid out like the policy), "auto" (the first
    # under LoRA, else the second).
    reference: str = "auto"

    @classmethod
    def from_dict(cls, table: dict[str, Any]) -> DpoSettings:
        return from_table(cls, table, "dpo", DpoError)

    def check(self) -> None:
        if not self.data:
            raise DpoError('dpo.data names no preference pairs: dpo.data = "pairs.jsonl"')
        if self.loss_type not in LOSSES:
            raise DpoError(f"unknown dpo.loss_type {self.loss_type!r}: use {', '.join(LOSSES)}")
        if self.reference not in REFERENCES:
            raise DpoError(f"unknown dpo.reference {self.reference!r}: use {', '.join(REFERENCES)}")
        if self.beta <= 0:
            raise DpoError(f"dpo.beta must be positive, got {self.beta}")
        if not 0 <= self.label_smoothing < 0.5:
            raise DpoError(f"dpo.label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        if self.label_smoothing and self.loss_type != "robust":
            raise DpoError(
                "dpo.label_smoothing is the robust loss's (TRL's label-smoothed DPO): "
                'set dpo.loss_type = "robust"'
            )
        if self.max_length < 2:
            raise DpoError(f"dpo.max_length must be at least 2, got {self.max_length}")


def sequence_logps(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each sequence's log-probability of its completion: the sum over the tokens `mask`
    marks of log p(token | the tokens before it)."""
    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    targets = ids[:, 1:]
    chosen = logprobs.gather(-1, targets[..., None])[..., 0]
    return (chosen * mask[:, 1:].to(chosen.dtype)).sum(dim=1)


def pair_terms(
    policy: torch.Tensor, reference: torch.Tensor, mask: torch.Tensor, settings: DpoSettings
) -> dict[str, torch.Tensor]:
    """Each pair's loss and TRL's metrics ([batch] each), from each sequence's
    log-probability under the policy and the reference ([2 x batch]: chosen rows, then
    rejected rows)."""
    chosen_logps, rejected_logps = policy.chunk(2)
    ref_chosen, ref_rejected = reference.chunk(2)
    chosen_ratio = chosen_logps - ref_chosen
    rejected_ratio = rejected_logps - ref_rejected
    delta = chosen_ratio - rejected_ratio
    beta, smoothing = settings.beta, settings.label_smoothing
    if settings.loss_type == "sigmoid":
        per_pair = -F.logsigmoid(beta * delta)
    elif settings.loss_type == "robust":
        clean = -(1 - smoothing) * F.logsigmoid(beta * delta)
        flipped = -smoothing * F.logsigmoid(-beta * delta)
        per_pair = (clean - flipped) / (1 - 2 * smoothing)
    elif settings.loss_type == "hinge":
        per_pair = torch.relu(1 - beta * delta)
    else:  # ipo: the log-ratios per completion token
        chosen_mask, rejected_mask = mask.chunk(2)
        chosen_tokens = chosen_mask.sum(dim=1).clamp(min=1).to(delta.dtype)
        rejected_tokens = rejected_mask.sum(dim=1).clamp(min=1).to(delta.dtype)
        per_token = chosen_ratio / chosen_tokens - rejected_ratio / rejected_tokens
        per_pair = (per_token - 1 / (2 * beta)) ** 2
    chosen_rewards = beta * chosen_ratio.detach()
    rejected_rewards = beta * rejected_ratio.detach()
    return {
        "loss": per_pair,
        "rewards/chosen": chosen_rewards,
        "rewards/rejected": rejected_rewards,
        "rewards/accuracies": (chosen_rewards > rejected_rewards).float(),
        "rewards/margins": chosen_rewards - rejected_rewards,
        "logps/chosen": chosen_logps.detach(),
        "logps/rejected": rejected_logps.detach(),
    }


def preference_loss(
    policy: torch.Tensor, reference: torch.Tensor, mask: torch.Tensor, settings: DpoSettings
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The batch's loss (the pairs' mean) and the means of TRL's metrics."""
    terms = pair_terms(policy, reference, mask, settings)
    loss = terms.pop("loss").mean()
    return loss, {name: value.mean() for name, value in terms.items()}


def reference_logits(model: nn.Module, reference: nn.Module | None, ids: torch.Tensor) -> Any:
    """The reference's logits of `ids`, without gradients: the frozen copy's, or the LoRA
    model's with its adapters off."""
    with torch.no_grad():
        if reference is not None:
            return reference(input_ids=ids).logits
        with adapters_off(model):
            return model(input_ids=ids).logits


@contextlib.contextmanager
def adapters_off(model: nn.Module) -> Iterator[None]:
    """The LoRA model as its base: its adapters disabled for the block (peft's own switch)."""
    with model.disable_adapter():  # type: ignore[operator]
        yield
