"""`objective = "grpo"`: the task's model trained by GRPO on rollouts it generates itself.

Each step (each micro-batch, under `grad_accum`) takes the next `completions / G` prompts of
a seeded order (the same on every host), samples G completions of each with the generation
engine on the model being trained (the same weights, laid out as training lays them out:
one compiled prefill for the prompts' bucket and one compiled decode step), scores them with
the reward functions on the host, and computes their advantages (`grpo.py`). The step then
trains on fixed-shape rows, `max_prompt_length + max_completion_length` tokens each: the
prompt, its completion, right-padding; `mask` marks the completion's tokens and `weights`
their share of the loss. The engine's reads of the generated tokens (every `check_every`
tokens) and the rewards are the host's work between steps; the step itself reads nothing.

An evaluation (`eval_every`, and at the end) samples one completion of each held-out prompt
(`eval_fraction`) with a fixed seed and reports the mean reward; its `loss` is the negative
mean reward, so the best checkpoint is the most rewarded.
"""

from __future__ import annotations

import contextlib
import random
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from .dpo import reference_logits
from .grpo import (
    GrpoError,
    GrpoSettings,
    advantages,
    nanstd,
    policy_terms,
    token_logps,
    token_weights,
)
from .preferences import PreferenceError, _ids, conversational, read_rows
from .rewards import Rewards

EVAL_SEED_OFFSET = 1 << 30  # the evaluation's sampling numbers: apart from any rollout's


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    prompt: Any  # as the data gives it: a string or a list of messages
    columns: dict[str, Any]


class Shapes(Dataset[dict[str, torch.Tensor]]):
    """A step's rows as the trainer sees them, empty: the loop's count of steps per epoch
    (`completions` rows) and the shape it sizes the step by."""

    def __init__(self, completions: int, length: int) -> None:
        self.completions, self.length = completions, length

    def __len__(self) -> int:
        return self.completions

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return empty_row(self.length)


def empty_row(length: int) -> dict[str, torch.Tensor]:
    return {
        "ids": torch.zeros(length, dtype=torch.long),
        "mask": torch.zeros(length, dtype=torch.long),
        "weights": torch.zeros(length, dtype=torch.float32),
        "advantages": torch.zeros((), dtype=torch.float32),
    }


class GrpoObjective:
    """The task's model trained by GRPO (see the module's docstring)."""

    def __init__(self, base: Any, settings: GrpoSettings, seed: int = 0) -> None:
        tokenizer = getattr(base, "tokenizer", None)
        if tokenizer is None:
            raise GrpoError(
                "grpo samples text through the model's tokenizer: the task has none (a "
                "pretrained model_name brings its own)"
            )
        self.base, self.settings, self.tokenizer, self.seed = base, settings, tokenizer, seed
        self.name = base.name
        self.rewards = Rewards(settings.reward_funcs, settings.reward_weights)
        prompts = self._read(settings)
        order = list(range(len(prompts)))
        random.Random(0).shuffle(order)  # the same split on every host
        held = round(len(order) * settings.eval_fraction)
        self.train = [prompts[i] for i in sorted(order[held:])]
        self.eval = [prompts[i] for i in sorted(order[:held])] or self.train
        self.reference: nn.Module | None = None  # the frozen copy, when beta asks for one
        self.engine: Any = None
        self.replicas = 1  # data-parallel processes whose losses are averaged
        self.host_metrics: dict[str, float] = {}  # the last rollout's, logged with its step
        self._last: dict[str, torch.Tensor] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    # ---- the data ------------------------------------------------------------------
    def _read(self, settings: GrpoSettings) -> list[Prompt]:
        try:
            rows = read_rows(settings.prompts, "prompts")
        except PreferenceError as error:
            raise GrpoError(str(error)) from None
        lacking = next((n for n, row in enumerate(rows, 1) if "prompt" not in row), 0)
        if lacking:
            raise GrpoError(
                f"{settings.prompts}: the prompts have no 'prompt' column (row {lacking} has "
                f"{', '.join(sorted(rows[lacking - 1])) or 'nothing'})"
            )
        prompts, long = [], 0
        for row in rows:
            ids = _ids(self.tokenizer, row["prompt"], generation_prompt=True)
            if not ids or len(ids) > settings.max_prompt_length:
                long += 1
                continue
            columns = {key: value for key, value in row.items() if key != "prompt"}
            prompts.append(Prompt(ids, row["prompt"], columns))
        if long:
            warnings.warn(
                f"{long} of {len(rows)} prompts of {settings.prompts} are empty or longer than "
                f"grpo.max_prompt_length ({settings.max_prompt_length} tokens): left out",
                stacklevel=2,
            )
        if not prompts:
            raise GrpoError(
                f"{settings.prompts}: no prompt fits grpo.max_prompt_length "
                f"({settings.max_prompt_length} tokens)"
            )
        return prompts

    @property
    def length(self) -> int:
        return self.settings.max_prompt_length + self.settings.max_completion_length

    @property
    def tokens_per_sample(self) -> int:
        return self.length

    def train_dataset(self) -> Shapes:
        return Shapes(len(self.train) * self.settings.num_generations, self.length)

    def eval_dataset(self) -> Shapes:
        return Shapes(len(self.eval) * self.settings.num_generations, self.length)

    def wants_copy(self, lora: bool) -> bool:
        """Whether the KL term's reference is a frozen copy (beta 0: there is no reference)."""
        if not self.settings.beta:
            return False
        if self.settings.reference == "adapters-off" and not lora:
            raise GrpoError(
                'grpo.reference = "adapters-off" is the LoRA model without its adapters: '
                'train with [lora], or use grpo.reference = "copy"'
            )
        return self.settings.reference == "copy" or not lora

    def check_batch(self, completions: int) -> None:
        self.settings.check_batch(completions)

    # ---- rollouts -------------------------------------------------------------------
    def prepare_rollouts(
        self, model: nn.Module, strategy: Any, completions: int, host_read: Any
    ) -> None:
        """The engine on the model, its prefill and decode step compiled (the run's set-up)."""
        self.settings.check_batch(completions)
        self._engine(model, strategy, completions, host_read)

    def _engine(self, model: nn.Module, strategy: Any, slots: int, host_read: Any) -> Any:
        if self.engine is None:
            self.replicas = strategy.data_layout()[0]
            from ..generation.cli import end_ids
            from ..generation.engine import Engine, Shape
            from ..generation.sampling import Sampling

            s = self.settings
            shape = Shape(slots, (s.max_prompt_length,), s.max_completion_length, s.check_every)
            sampling = Sampling(s.temperature, s.top_k, s.top_p, self.seed)
            self.engine = Engine(
                model, self.tokenizer, strategy, shape, sampling, end_ids(model, self.tokenizer),
                s.stop_strings, host_read,
            )  # fmt: skip
            self.engine.warm_up()
            model.train()
        return self.engine

    def rollouts(
        self,
        model: nn.Module,
        strategy: Any,
        completions: int,
        epoch: int,
        skip: int,
        host_read: Callable[[], contextlib.AbstractContextManager[Any]],
    ) -> Iterator[dict[str, torch.Tensor]]:
        """The micro-batches of `epoch` from the `skip`-th: each a rollout of `completions`
        (the global batch), this process's rows on the device."""
        self.settings.check_batch(completions)
        engine = self._engine(model, strategy, completions, host_read)
        per_step = completions // self.settings.num_generations
        order = list(range(len(self.train)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        steps = len(order) // per_step
        for index in range(skip, steps):
            chosen = [self.train[i] for i in order[index * per_step : (index + 1) * per_step]]
            number = (epoch * steps + index) * completions
            yield self.rollout(engine, chosen, number, strategy)
            model.train()

    def rollout(
        self, engine: Any, prompts: list[Prompt], number: int, strategy: Any
    ) -> dict[str, torch.Tensor]:
        """G completions of each prompt, scored; this process's rows of the step's batch."""
        group = self.settings.num_generations
        repeated = [prompt for prompt in prompts for _ in range(group)]
        done = engine.generate([prompt.ids for prompt in repeated], first_number=number)
        scores = self.score(repeated, [c.tokens for c in done], [c.text for c in done])
        batch, self.host_metrics = self.rows(repeated, [c.tokens for c in done], scores)
        self.host_metrics.update(lengths(done, self.settings.max_completion_length))
        replicas, rank = strategy.data_layout()
        mine = len(repeated) // replicas
        part = slice(rank * mine, (rank + 1) * mine)
        return {key: strategy.place_rows(value[part]) for key, value in batch.items()}

    def score(
        self, prompts: list[Prompt], completion_ids: list[list[int]], texts: list[str]
    ) -> torch.Tensor:
        """[completions, functions] rewards of the reward functions, as TRL calls them."""
        given = [prompt.prompt for prompt in prompts]
        completions: list[Any] = [
            [{"role": "assistant", "content": text}] if conversational(prompt) else text
            for prompt, text in zip(given, texts, strict=True)
        ]
        keys = sorted({key for prompt in prompts for key in prompt.columns})
        columns = {key: [prompt.columns.get(key) for prompt in prompts] for key in keys}
        return self.rewards(given, completions, completion_ids, columns)

    def rows(
        self, prompts: list[Prompt], completion_ids: list[list[int]], scores: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Every completion's training row (the global batch's, on the host) and TRL's reward
        metrics."""
        settings, length = self.settings, self.length
        pad = self.engine.pad_id if self.engine is not None else 0
        count = len(prompts)
        ids = torch.full((count, length), pad, dtype=torch.long)
        mask = torch.zeros((count, length), dtype=torch.long)
        for row, (prompt, tokens) in enumerate(zip(prompts, completion_ids, strict=True)):
            whole = prompt.ids + list(tokens)[: settings.max_completion_length]
            ids[row, : len(whole)] = torch.tensor(whole, dtype=torch.long)
            mask[row, len(prompt.ids) : len(whole)] = 1
        gains, metrics = advantages(scores, self.rewards.weights, settings)
        for index, name in enumerate(self.rewards.names):
            column = scores[:, index]
            metrics[f"rewards/{name}/mean"] = float(torch.nanmean(column))
            metrics[f"rewards/{name}/std"] = float(nanstd(column))
        weights = token_weights(mask, settings, self.replicas)
        return {"ids": ids, "mask": mask, "weights": weights, "advantages": gains}, metrics

    # ---- the step -------------------------------------------------------------------
    def _token_logps(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        ids = batch["ids"]
        temperature = self.settings.temperature
        logps, entropy = token_logps(model(input_ids=ids).logits, ids, temperature)
        reference = None
        if self.settings.beta:
            logits = reference_logits(model, self.reference, ids)
            reference, _ = token_logps(logits, ids, temperature)
        return logps, reference, entropy

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logps, reference, entropy = self._token_logps(model, batch)
        loss, self._last = policy_terms(
            logps, reference, batch["advantages"], batch["weights"][:, 1:], batch["mask"][:, 1:],
            entropy, self.settings,
        )  # fmt: skip
        return loss

    def train_metrics(self, model: nn.Module) -> dict[str, torch.Tensor]:
        taken, self._last = self._last, {}
        return taken

    # ---- evaluation -------------------------------------------------------------------
    def evaluator(self, model: nn.Module, strategy: Any, completions: int, host_read: Any) -> Any:
        return RewardEvaluation(self, model, strategy, completions, host_read)


def lengths(done: list[Any], most: int) -> dict[str, float]:
    """TRL's completion-length metrics of a rollout."""
    sizes = [len(c.tokens) for c in done]
    ended = [len(c.tokens) for c in done if c.finish_reason == "stop"]
    return {
        "completions/mean_length": sum(sizes) / len(sizes),
        "completions/min_length": float(min(sizes)),
        "completions/max_length": float(max(sizes)),
        "completions/clipped_ratio": 1 - len(ended) / len(sizes),
        "completions/mean_terminated_length": sum(ended) / len(ended) if ended else 0.0,
    }


class RewardEvaluation:
    """The held-out prompts' mean reward: one completion each, sampled with a fixed seed."""

    def __init__(
        self, objective: GrpoObjective, model: nn.Module, strategy: Any, slots: int, read: Any
    ) -> None:
        self.objective, self.model, self.strategy = objective, model, strategy
        self.slots, self.read = slots, read
        self.global_batch = slots
        self.runs = 0

    def __call__(self, model: nn.Module) -> dict[str, float]:
        self.runs += 1
        objective = self.objective
        engine = objective._engine(model, self.strategy, self.slots, self.read)
        prompts = objective.eval
        done = engine.generate([p.ids for p in prompts], first_number=EVAL_SEED_OFFSET)
        model.train()
        scores = objective.score(prompts, [c.tokens for c in done], [c.text for c in done])
        weighted = (scores * objective.rewards.weights[None, :]).nansum(dim=1)
        weighted[torch.isnan(scores).all(dim=1)] = torch.nan
        reward = float(torch.nanmean(weighted))
        metrics = {"loss": -reward, "reward": reward}
        for index, name in enumerate(objective.rewards.names):
            metrics[f"rewards/{name}/mean"] = float(torch.nanmean(scores[:, index]))
        metrics["completions/mean_length"] = sum(len(c.tokens) for c in done) / len(done)
        return metrics
