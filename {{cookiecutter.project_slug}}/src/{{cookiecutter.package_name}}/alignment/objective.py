"""What a run trains its task's model for: the task's own loss, `objective = "dpo"`, or
`objective = "grpo"` (`rollouts.py`).

A DPO run keeps the task's model (and its pretrained weights, LoRA, layout) and replaces its
data and loss: the `[dpo]` table's preference pairs, and TRL's preference losses (`dpo.py`).
"""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import nn

from .dpo import (
    DpoError,
    DpoSettings,
    pair_terms,
    preference_loss,
    reference_logits,
    sequence_logps,
)
from .preferences import Pairs, read_pairs

OBJECTIVES = ("causal-lm", "dpo", "grpo")


def of_run(config: Any, task: Any) -> Any:
    """The task a run trains: `task` itself, or its model under DPO or GRPO."""
    if config.objective == "causal-lm":
        return task
    if config.objective == "grpo":
        from .grpo import GrpoSettings
        from .rollouts import GrpoObjective

        return GrpoObjective(task, GrpoSettings.from_dict(config.grpo), config.seed)
    return DpoObjective(task, DpoSettings.from_dict(config.dpo))


class DpoObjective:
    """The task's model trained by DPO on preference pairs (see the module's docstring)."""

    def __init__(self, base: Any, settings: DpoSettings) -> None:
        tokenizer = getattr(base, "tokenizer", None)
        if tokenizer is None:
            raise DpoError(
                "dpo reads text pairs through the model's tokenizer: the task has none (a "
                "pretrained model_name brings its own)"
            )
        self.base, self.settings, self.tokenizer = base, settings, tokenizer
        self.name = base.name
        examples = read_pairs(settings.data)
        order = list(range(len(examples)))
        random.Random(0).shuffle(order)  # the same split on every host
        held = round(len(order) * settings.eval_fraction)
        train = [examples[i] for i in sorted(order[held:])]
        evaluation = [examples[i] for i in sorted(order[:held])] or train
        length = settings.max_length
        self.train = Pairs(train, tokenizer, length, f"{settings.data} (training)")
        self.eval = Pairs(evaluation, tokenizer, length, f"{settings.data} (evaluation)")
        self.reference: nn.Module | None = None  # the frozen copy, when one is laid out
        self._last: dict[str, torch.Tensor] = {}

    def __getattr__(self, name: str) -> Any:
        # The base task's model and its facts: build_model, pretrained_weights, block_class...
        return getattr(self.base, name)

    @property
    def tokens_per_sample(self) -> int:
        return 2 * self.settings.max_length  # a pair: chosen and rejected

    def wants_copy(self, lora: bool) -> bool:
        """Whether the reference is a frozen copy of the model (else the LoRA model with its
        adapters disabled)."""
        if self.settings.reference == "adapters-off" and not lora:
            raise DpoError(
                'dpo.reference = "adapters-off" is the LoRA model without its adapters: '
                'train with [lora], or use dpo.reference = "copy"'
            )
        return self.settings.reference == "copy" or not lora

    def train_dataset(self) -> Pairs:
        return self.train

    def eval_dataset(self) -> Pairs:
        return self.eval

    def _logps(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The policy's and the reference's log-probability of each sequence, and the mask,
        of one forward of the batch's chosen rows and then its rejected rows."""
        ids = torch.cat([batch["ids"][:, 0], batch["ids"][:, 1]])
        mask = torch.cat([batch["mask"][:, 0], batch["mask"][:, 1]])
        policy = sequence_logps(model(input_ids=ids).logits, ids, mask)
        reference = sequence_logps(reference_logits(model, self.reference, ids), ids, mask)
        return policy, reference, mask

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        policy, reference, mask = self._logps(model, batch)
        loss, self._last = preference_loss(policy, reference, mask, self.settings)
        return loss

    def train_metrics(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """TRL's metrics of the last training forward, taken (a step keeps no tensor)."""
        taken, self._last = self._last, {}
        return taken

    def metrics(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per pair: its loss and TRL's metrics (their means are the evaluation's)."""
        policy, reference, mask = self._logps(model, batch)
        return pair_terms(policy, reference, mask, self.settings)
