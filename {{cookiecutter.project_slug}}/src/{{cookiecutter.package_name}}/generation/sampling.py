"""Choosing the next token on the device: greedy, temperature, top-k, top-p, seeded.

Sampling draws no random numbers from a generator: each candidate's noise is a hash of
(seed, the prompt's number, the token's place in the completion, the candidate's id),
computed with 32-bit integer arithmetic on the device. The same seed therefore gives the
same noise on one device, on any mesh and on either backend, whatever the batch a prompt
shares its slots with; the chosen tokens are the same wherever the logits are (they differ
only by float rounding across layouts, so two candidates whose scores tie within it may
swap). The token is `argmax(log p - log E)` with E exponential noise: a sample of the
(truncated, tempered) distribution p, with no host round trip (the exponential race).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK = 0xFFFFFFFF
_MIX = 0x45D9F3B  # the finalizer's multiplier: below 2**31, so products fit an int64
_STREAMS = (0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D)  # one odd constant per coordinate


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen. `temperature` 0 is greedy (the others are then unused);
    `top_k` 0 and `top_p` 1.0 keep every candidate."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must not be negative, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must not be negative (0: every token), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (the murmur3 finalizer's shape), in int64 without overflow."""
    x = x ^ (x >> 16)
    x = (x * _MIX) & _MASK
    x = x ^ (x >> 16)
    x = (x * _MIX) & _MASK
    return x ^ (x >> 16)


def uniform_noise(seed: int, rows: torch.Tensor, step: torch.Tensor, vocab: int) -> torch.Tensor:
    """[len(rows), vocab] floats in (0, 1): a function of the seed, each row's prompt number,
    the step (a device scalar) and the candidate's id, and of nothing else."""
    ids = torch.arange(vocab, device=rows.device, dtype=torch.int64)
    x = torch.full_like(rows, seed & _MASK, dtype=torch.int64)
    for value, stream in zip((rows, step.to(torch.int64)), _STREAMS, strict=False):
        x = _mix((x + (value & _MASK) * stream) & _MASK)
    x = _mix((x[:, None] + ids[None, :] * _STREAMS[2]) & _MASK)
    # The top 24 bits, exact in float32, and never 0 or 1.
    return ((x >> 8).to(torch.float32) + 0.5) / float(1 << 24)


def next_tokens(
    logits: torch.Tensor, sampling: Sampling, rows: torch.Tensor, step: torch.Tensor
) -> torch.Tensor:
    """The next token of each row of `logits` [rows, vocab] (fp32 math), as a [rows] int64."""
    logits = logits.float()
    if sampling.greedy:
        return logits.argmax(dim=-1)
    logits = logits / sampling.temperature
    vocab = logits.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1:
        ordered, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # the mass of the better candidates
        dropped = before > sampling.top_p  # the best one is always kept
        drop = torch.zeros_like(dropped).scatter(-1, order, dropped)
        logits = logits.masked_fill(drop, float("-inf"))
    log_probs = torch.log_softmax(logits, dim=-1)
    exponential = -torch.log(uniform_noise(sampling.seed, rows, step, vocab))
    return (log_probs - torch.log(exponential)).argmax(dim=-1)
