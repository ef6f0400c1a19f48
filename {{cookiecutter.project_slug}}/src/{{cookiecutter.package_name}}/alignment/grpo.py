"""Group relative policy optimization as TRL 1.16's `GRPOTrainer` defines it: its advantages,
its losses (`grpo`, `dapo`, `dr_grpo`), its KL term and its metrics.

A step's batch is `num_generations` (G) completions of each of its prompts, sampled from the
policy being trained. Each completion's reward is the weighted sum of the reward functions'
(`rewards.py`); its advantage is its reward less its group's mean, divided by the group's
standard deviation + 1e-4 (`scale_rewards = "group"`; `"batch"`: the batch's; `"none"`: not
divided). Per completion token, with `r = exp(logp - logp_old)` (1 in value, since a batch is
trained on once, as TRL's default `num_iterations = 1`; its gradient is logp's):

    loss_t = -min(r A, clip(r, 1 - epsilon, 1 + epsilon_high) A) + beta r KL_t,
    KL_t = exp(ref - logp) - (ref - logp) - 1      (the k3 estimator; beta 0: no reference)

(`r KL_t`: TRL's `use_bias_correction_kl`, the unbiased reverse-KL gradient; false: `KL_t`)

and the step's loss sums the tokens with weights that make TRL's normalizations:

- `grpo`: each completion's mean over its tokens, then the batch's mean;
- `dapo` (TRL's default): the sum over every completion token of the batch, divided by the
  batch's completion tokens;
- `dr_grpo`: the sum divided by (completions x `max_completion_length`).

The weights are computed by the host with the rollouts (a [completions, length] input of the
step), so the three are one graph. Log-probabilities are of the logits divided by the
sampling temperature, as TRL's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .settings import from_table

LOSSES = ("grpo", "dapo", "dr_grpo")
SCALES = ("group", "batch", "none")
REFERENCES = ("auto", "adapters-off", "copy")
STD_EPSILON = 1e-4  # TRL's: advantages / (std + 1e-4)


class GrpoError(ValueError):
    """GRPO settings no run can use; the message names the key."""


@dataclass(frozen=True)
class GrpoSettings:
    """The `[grpo]` table."""

    prompts: str = ""  # a .jsonl, .json or .parquet file of prompts, local or gs://
    reward_funcs: list[str] = field(default_factory=list)  # "module:function", "file.py:function"
    reward_weights: list[float] = field(default_factory=list)  # default: 1 each
    num_generations: int = 8
    max_prompt_length: int = 256
    max_completion_length: int = 256
    loss_type: str = "dapo"
    beta: float = 0.0
    epsilon: float = 0.2
    epsilon_high: float = 0.0  # 0: epsilon
    scale_rewards: str = "group"
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    stop_strings: list[str] = field(default_factory=list)
    eval_fraction: float = 0.05
    reference: str = "auto"
    use_bias_correction_kl: bool = True  # TRL's default: the KL term times r
    check_every: int = 16  # tokens between the host's reads of the rollouts

    @classmethod
    def from_dict(cls, table: dict[str, Any]) -> GrpoSettings:
        return from_table(cls, table, "grpo", GrpoError)

    @property
    def clip_high(self) -> float:
        return self.epsilon_high or self.epsilon

    def check(self) -> None:
        if not self.prompts:
            raise GrpoError('grpo.prompts names no prompts: grpo.prompts = "prompts.jsonl"')
        if not self.reward_funcs or not all(isinstance(f, str) for f in self.reward_funcs):
            raise GrpoError(
                "grpo.reward_funcs names no reward function: "
                'grpo.reward_funcs = ["my_rewards:correct"] (module:function or file.py:function)'
            )
        if self.reward_weights and len(self.reward_weights) != len(self.reward_funcs):
            raise GrpoError(
                f"grpo.reward_weights has {len(self.reward_weights)} weights for "
                f"{len(self.reward_funcs)} reward functions: give one each"
            )
        choices = (("loss_type", LOSSES), ("scale_rewards", SCALES), ("reference", REFERENCES))
        for name, allowed in choices:
            if getattr(self, name) not in allowed:
                raise GrpoError(
                    f"unknown grpo.{name} {getattr(self, name)!r}: use {', '.join(allowed)}"
                )
        if self.num_generations < 2:
            raise GrpoError(
                f"grpo.num_generations must be at least 2 (a group's advantages are relative "
                f"to its mean), got {self.num_generations}"
            )
        for name in ("max_prompt_length", "max_completion_length", "check_every"):
            if getattr(self, name) < 1:
                raise GrpoError(f"grpo.{name} must be at least 1, got {getattr(self, name)}")
        if self.beta < 0 or self.epsilon <= 0 or self.epsilon_high < 0:
            raise GrpoError(
                "grpo.beta must not be negative, grpo.epsilon must be positive and "
                f"grpo.epsilon_high not negative, got {self.beta}, {self.epsilon} and "
                f"{self.epsilon_high}"
            )
        if self.temperature <= 0:
            raise GrpoError(
                f"grpo.temperature must be positive (rollouts are sampled), got {self.temperature}"
            )
        if self.top_k < 0 or not 0 < self.top_p <= 1:
            raise GrpoError(
                f"grpo.top_k must not be negative and grpo.top_p in (0, 1], got {self.top_k} "
                f"and {self.top_p}"
            )
        if not 0 <= self.eval_fraction < 1:
            raise GrpoError(f"grpo.eval_fraction must be in [0, 1), got {self.eval_fraction}")

    def check_batch(self, completions: int) -> None:
        """A global batch of `completions` holds whole groups."""
        if completions % self.num_generations:
            raise GrpoError(
                f"grpo.num_generations = {self.num_generations} does not divide the global "
                f"batch of {completions} completions: use a batch_size whose global batch is "
                f"a multiple of {self.num_generations}"
            )


def nanstd(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """TRL's `nanstd`: the standard deviation with Bessel's correction, NaNs left out."""
    keep = dim is not None
    mean = torch.nanmean(values, dim=dim, keepdim=True)
    variance = torch.nanmean((values - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(values), dim=dim, keepdim=True)
    variance = variance * count / (count - 1)
    std = torch.sqrt(variance)
    return std if keep else std.reshape(())


def advantages(
    rewards_per_func: torch.Tensor, weights: torch.Tensor, settings: GrpoSettings
) -> tuple[torch.Tensor, dict[str, float]]:
    """Each completion's advantage ([completions], float32) from its rewards
    ([completions, functions]; NaN: a function that gave None), as TRL 1.16 computes it
    (`multi_objective_aggregation = "sum_then_normalize"`), and TRL's reward metrics."""
    group = settings.num_generations
    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    rewards = (rewards_per_func * weights[None, :]).nansum(dim=1)
    rewards[unscorable] = torch.nan
    grouped_mean = torch.nanmean(rewards.view(-1, group), dim=1).repeat_interleave(group)
    if settings.scale_rewards == "batch":
        std = nanstd(rewards).expand_as(rewards)
    else:
        std = nanstd(rewards.view(-1, group), dim=1).reshape(-1).repeat_interleave(group)
    advantage = rewards - grouped_mean
    if settings.scale_rewards != "none":
        advantage = advantage / (std + STD_EPSILON)
    zero_std = torch.isclose(std, torch.zeros_like(std))
    advantage = torch.nan_to_num(advantage, nan=0.0)
    logged = (rewards_per_func * weights[None, :]).nansum(dim=1)
    logged[unscorable] = torch.nan
    metrics = {
        "reward": float(torch.nanmean(logged)),
        "reward_std": float(nanstd(logged)),
        "frac_reward_zero_std": float(zero_std.float().mean()),
    }
    return advantage.float(), metrics


def token_weights(
    completion_mask: torch.Tensor, settings: GrpoSettings, replicas: int
) -> torch.Tensor:
    """Per completion token ([completions, length]), the weight of its loss in the step's
    sum, for this process's rows of a global batch whose completion mask is
    `completion_mask` (every replica's rows, in order): the loss type's normalization.
    Replicas' losses are averaged (their gradients are), so each process's weights make its
    share of the global normalization times `replicas`."""
    mask = completion_mask.float()
    rows = mask.shape[0] // replicas  # each process's rows
    if settings.loss_type == "grpo":
        return mask / mask.sum(dim=1, keepdim=True).clamp(min=1.0) / rows
    if settings.loss_type == "dapo":
        return mask / (mask.sum().clamp(min=1.0) / replicas)
    return mask / (rows * settings.max_completion_length)  # dr_grpo


def token_logps(
    logits: torch.Tensor, ids: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each position's log-probability of the next id and the entropy of its distribution
    ([rows, length - 1] each), from the logits divided by the sampling temperature."""
    scaled = logits[:, :-1].float() / temperature
    logprobs = torch.log_softmax(scaled, dim=-1)
    chosen = logprobs.gather(-1, ids[:, 1:, None])[..., 0]
    entropy = -(logprobs.exp() * logprobs).sum(dim=-1)
    return chosen, entropy


def policy_terms(
    logps: torch.Tensor,
    reference: torch.Tensor | None,
    advantage: torch.Tensor,
    weights: torch.Tensor,
    mask: torch.Tensor,
    entropy: torch.Tensor,
    settings: GrpoSettings,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The step's loss and TRL's metrics (device scalars) from the completion tokens'
    log-probabilities ([rows, length]; `mask` marks the completion's tokens)."""
    ratio = torch.exp(logps - logps.detach())  # r: 1 in value, logp's gradient
    clipped = torch.clamp(ratio, 1 - settings.epsilon, 1 + settings.clip_high)
    gain = advantage[:, None]
    per_token = -torch.min(ratio * gain, clipped * gain)
    mask = mask.float()
    tokens = mask.sum().clamp(min=1.0)

    def masked_mean(values: torch.Tensor) -> torch.Tensor:
        return (values * mask).sum() / tokens

    metrics: dict[str, torch.Tensor] = {}
    if reference is not None and settings.beta:
        kl = torch.exp(reference - logps) - (reference - logps) - 1
        if settings.use_bias_correction_kl:  # times r: the unbiased reverse-KL gradient
            kl = kl * ratio
        per_token = per_token + settings.beta * kl
        metrics["kl"] = masked_mean(kl.detach())
    loss = (per_token * weights.float()).sum()
    low = ((ratio < 1 - settings.epsilon) & (gain < 0)).float()
    high = ((ratio > 1 + settings.clip_high) & (gain > 0)).float()
    metrics["entropy"] = masked_mean(entropy.detach())
    metrics["clip_ratio/low_mean"] = masked_mean(low.detach())
    metrics["clip_ratio/high_mean"] = masked_mean(high.detach())
    metrics["clip_ratio/region_mean"] = masked_mean(torch.maximum(low, high).detach())
    return loss, metrics
