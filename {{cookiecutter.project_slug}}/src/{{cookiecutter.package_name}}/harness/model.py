"""The model lm-evaluation-harness evaluates: a `TemplateLM` over the laid-out model.

`loglikelihood` and `loglikelihood_rolling` are batched forwards in fixed shapes: each
request's tokens, truncated from the left to `max_length + 1` as lm-eval's own `hf` model
truncates them, right-padded to the smallest of the length buckets that holds them, `slots`
rows a batch; one compiled step per bucket returns every position's log-probability of the
next token and whether it was the likeliest, and the host sums a continuation's. No
generation. `generate_until` runs the generation engine (greedy, with the request's stop
texts and the tokenizer's end ids). Every process of a job runs every request; each computes
its rows of a batch and the rows are exchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import (
    _add_special_kwargs,
    handle_stop_sequences,
    normalize_gen_kwargs,
    postprocess_generated_text,
)
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from .. import hf
from ..core import ReplayedStep, Strategy, ops
from ..generation.engine import Engine, GenerationError, Shape, gather_rows
from ..hf.moe import drop_router_numbers

NAME = "{{ cookiecutter.project_slug }}"  # lm-eval's name for this model
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's own default for generate_until


@register_model(NAME)
class ProjectLM(TemplateLM):
    """lm-eval's view of a model laid out by `strategy` (see the module's docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        strategy: Strategy,
        buckets: Sequence[int] = (256, 1024),
        slots: int = 8,
        max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
        host_read: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    ) -> None:
        super().__init__()
        self.model, self.tokenizer, self.strategy = model, tokenizer, strategy
        self.buckets, self.slots, self.max_gen_toks = tuple(buckets), slots, max_gen_toks
        self.host_read = host_read or contextlib.nullcontext
        replicas, self.rank_in_job = strategy.data_layout()
        if slots % replicas:
            raise GenerationError(
                f"{slots} slots do not split over {replicas} data-parallel replicas: "
                f"use a multiple of {replicas}"
            )
        self.rows = slots // replicas
        self.replicas = replicas
        state = lambda: [*model.parameters(), *model.buffers()]  # noqa: E731
        self.scorers = {
            bucket: ReplayedStep(self._score, state, self.host_read) for bucket in self.buckets
        }
        self.engines: dict[int, Engine] = {}  # by max_gen_toks

    # ---- lm-eval's interface --------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        for name in ("eos_token_id", "pad_token_id"):
            value = getattr(self.tokenizer, name, None)
            if isinstance(value, int):
                return value
        return 0

    @property
    def max_length(self) -> int:
        """The longest sequence one forward takes: the largest bucket."""
        return self.buckets[-1]

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **kwargs: Any
    ) -> list[int]:
        special = _add_special_kwargs(add_special_tokens, None)  # the tokenizer's own default
        return list(self.tokenizer.encode(string, **special))

    def tok_decode(self, tokens: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode(list(tokens), skip_special_tokens=skip_special_tokens))

    def _loglikelihood_tokens(
        self, requests: list[tuple[tuple[str, str], list[int], list[int]]], **kwargs: Any
    ) -> list[tuple[float, bool]]:
        rows = []
        for _, context, continuation in requests:
            whole = (context + continuation)[-(self.max_length + 1) :]
            rows.append((whole[:-1], whole[1:], len(continuation)))
        return self._score_rows(rows)

    def loglikelihood_rolling(self, requests: Any, disable_tqdm: bool = False) -> list[float]:
        windows: list[tuple[int, list[int], list[int]]] = []
        for index, (text,) in enumerate(request.args for request in requests):
            tokens = self.tok_encode(text)
            for context, continuation in map(
                make_disjoint_window,
                get_rolling_token_windows(tokens, self.prefix_token_id, self.max_length, 1),
            ):
                windows.append((index, context, continuation))
        scored = self._loglikelihood_tokens([(("", ""), c, t) for _, c, t in windows])
        totals = [0.0] * len(requests)
        for (index, _, _), (logprob, _) in zip(windows, scored, strict=True):
            totals[index] += logprob
        return totals

    def generate_until(self, requests: Any, disable_tqdm: bool = False) -> list[str]:
        eos = self.tok_decode([self.eot_token_id], skip_special_tokens=False)
        results: list[str] = [""] * len(requests)
        groups: dict[tuple[int, tuple[str, ...]], list[int]] = {}
        contexts: list[list[int]] = []
        for index, request in enumerate(requests):
            text, gen_kwargs = request.args
            kwargs = normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks)
            if kwargs.get("do_sample") or kwargs.get("temperature", 0.0):
                raise GenerationError(
                    "generate_until samples only greedily here: give the task's generation "
                    "do_sample: false (temperature 0)"
                )
            until = tuple(handle_stop_sequences(kwargs.get("until"), eos=eos))
            limit = int(kwargs["max_gen_toks"])
            contexts.append(self.tok_encode(text)[-(self.max_length - limit) :])
            groups.setdefault((limit, until), []).append(index)
        for (limit, until), indexes in groups.items():
            engine = self._engine(limit, until)
            engine.stop_strings = [stop for stop in until if stop]
            for index, completion in zip(
                indexes, engine.generate([contexts[i] for i in indexes]), strict=True
            ):
                text = self.tok_decode(completion.tokens)
                results[index] = postprocess_generated_text(text, list(until), None)
        return results

    # ---- the compiled scoring step --------------------------------------------------
    @torch.no_grad()
    def _score(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Each position's log-probability of its target, and whether it was the argmax."""
        logits = self.model(input_ids=inputs["ids"]).logits.float()
        drop_router_numbers(self.model)
        logprobs = torch.log_softmax(logits, dim=-1)
        targets = inputs["targets"]
        chosen = logprobs.gather(-1, targets[..., None])[..., 0]
        greedy = logits.argmax(dim=-1) == targets
        return chosen, greedy

    def _bucket(self, length: int) -> int:
        return next(size for size in self.buckets if length <= size)

    def _score_rows(self, rows: list[tuple[list[int], list[int], int]]) -> list[tuple[float, bool]]:
        """(log-likelihood of the last `n` targets, all of them the argmax) per row."""
        order = sorted(range(len(rows)), key=lambda i: (self._bucket(len(rows[i][0])), i))
        mine: dict[int, tuple[float, bool]] = {}
        for start in range(0, len(order), self.slots):
            batch = order[start : start + self.slots]
            bucket = max(self._bucket(len(rows[i][0])) for i in batch)
            local = batch[self.rank_in_job * self.rows : (self.rank_in_job + 1) * self.rows]
            ids = torch.full((self.rows, bucket), self.eot_token_id, dtype=torch.long)
            targets = torch.zeros((self.rows, bucket), dtype=torch.long)
            for row, index in enumerate(local):
                inputs, wanted, _ = rows[index]
                ids[row, : len(inputs)] = torch.tensor(inputs)
                targets[row, : len(wanted)] = torch.tensor(wanted)
            placed = {
                "ids": self.strategy.place_rows(ids),
                "targets": self.strategy.place_rows(targets),
            }
            with hf.generation_mode(self.model):  # eval mode, dropless experts
                chosen, greedy = self.scorers[bucket](placed)
                ops.sync()
            with self.host_read():
                chosen, greedy = ops.read_tensors([chosen, greedy])
            for row, index in enumerate(local):
                inputs, _, count = rows[index]
                span = slice(len(inputs) - count, len(inputs))
                mine[index] = (
                    float(chosen[row, span].double().sum()),
                    bool(greedy[row, span].all()),
                )
        merged = gather_rows(mine, self.replicas)
        return [merged[index] for index in range(len(rows))]

    def _engine(self, max_gen_toks: int, until: tuple[str, ...]) -> Engine:
        """The generation engine for completions of up to `max_gen_toks` tokens."""
        engine = self.engines.get(max_gen_toks)
        if engine is None:
            from ..generation.cli import end_ids

            shape = Shape(self.slots, self.buckets, max_gen_toks)
            stop_ids = end_ids(self.model, self.tokenizer)
            engine = Engine(self.model, self.tokenizer, self.strategy, shape, None, stop_ids, until)
            self.engines[max_gen_toks] = engine
        return engine
