"""The generation engine: a static key/value cache, one compiled prefill per prompt-length
bucket and one compiled decode step, sampling on the device.

A batch is `slots` prompts (this process's share: `slots` over the data-parallel replicas),
left-padded to the smallest bucket that holds the longest, so every row's next token is
written at the same cache position. The cache is transformers' `StaticCache`, its tensors
allocated once per layer ([slots, key/value heads, max_length, head dim], laid out over the
mesh as a batch is) and written in place by `index_copy_` at the position its layers keep on
the device. The prefill of a bucket fills the cache and draws each row's first token; the
decode step feeds the last token, marks its position in the attention mask, draws the next
and writes it into a [slots, max_new_tokens] buffer on the device. Both are the project's
compiled steps (`core.ReplayedStep`: traced twice, then replayed on torch_xla; compiled by
`torch.compile` on torch_tpu), all compiled by `warm_up`. The host reads the buffer and the
rows' end flags every `check_every` tokens (one transfer), to stop early once every row has
ended (an end-of-sequence id, or a stop string found in its text).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .. import hf
from ..core import ReplayedStep, Strategy, ops
from ..hf.moe import drop_router_numbers
from .sampling import Sampling, next_tokens

DEFAULT_CHECK_EVERY = 16  # tokens between the host's reads of what was generated
PREFILL_TRACED = "a prefill runs once a batch: traced each time, its compiled graph reused"


class GenerationError(ValueError):
    """A model, a prompt or settings the engine cannot run; the message says why."""


@dataclass(frozen=True)
class Shape:
    """The engine's fixed shapes: `slots` rows of the whole job, prompt-length `buckets`
    (ascending), `max_new_tokens` per row, and the host's reads every `check_every`."""

    slots: int = 8
    buckets: tuple[int, ...] = (64, 256)
    max_new_tokens: int = 128
    check_every: int = DEFAULT_CHECK_EVERY

    def __post_init__(self) -> None:
        if self.slots < 1 or self.max_new_tokens < 1 or self.check_every < 1:
            raise GenerationError(
                "slots, max_new_tokens and check_every must be at least 1, got "
                f"{self.slots}, {self.max_new_tokens} and {self.check_every}"
            )
        if not self.buckets or list(self.buckets) != sorted(set(self.buckets)):
            raise GenerationError(f"buckets must be ascending prompt lengths, got {self.buckets}")
        if self.buckets[0] < 1:
            raise GenerationError(f"buckets must be positive lengths, got {self.buckets}")

    @property
    def max_length(self) -> int:
        """The cache's length: the largest bucket and every new token."""
        return self.buckets[-1] + self.max_new_tokens

    def bucket(self, length: int) -> int:
        """The smallest bucket that holds a prompt of `length` tokens."""
        for size in self.buckets:
            if length <= size:
                return size
        raise GenerationError(
            f"a prompt of {length} tokens is longer than the largest bucket ({self.buckets[-1]}): "
            "add a larger bucket (generate --buckets) or shorten the prompt"
        )


@dataclass
class Completion:
    """One prompt's result: its generated ids, their text, and why it ended."""

    prompt_tokens: int
    tokens: list[int]
    text: str
    finish_reason: str  # "stop": an end id or a stop string; "length": max_new_tokens


@dataclass
class Timing:
    """What the last `generate` took: time to the first token of its first batch, the rest."""

    first_token_s: float = 0.0
    decode_s: float = 0.0
    generated: int = 0
    batches: int = 0
    reads: int = 0  # host reads of the generated tokens
    steps: int = 0  # decode steps run

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.decode_s if self.decode_s else 0.0


@dataclass
class _Batch:
    numbers: list[int]  # each row's prompt number in the request (-1: an empty row)
    prompts: list[list[int]]
    bucket: int


class Engine:
    """Generates from a `transformers` decoder laid out by `strategy`, in fixed shapes."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        strategy: Strategy,
        shape: Shape,
        sampling: Sampling | None = None,
        stop_ids: Sequence[int] = (),
        stop_strings: Sequence[str] = (),
        host_read: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    ) -> None:
        self.model, self.tokenizer, self.strategy, self.shape = model, tokenizer, strategy, shape
        self.sampling = sampling or Sampling()
        self.stop_strings = [text for text in stop_strings if text]
        self.host_read = host_read or contextlib.nullcontext
        inner = hf.unwrap(model)
        if inner is None:
            raise GenerationError(
                f"generation runs transformers decoders: {type(model).__name__} is not a "
                "PreTrainedModel (it has no key/value cache to keep)"
            )
        self.config = inner.config.get_text_config(decoder=True)
        self.stop_ids = sorted({int(i) for i in stop_ids})
        replicas, self.rank = strategy.data_layout()
        if shape.slots % replicas:
            raise GenerationError(
                f"{shape.slots} slots do not split over {replicas} data-parallel replicas: "
                f"use a multiple of {replicas}"
            )
        self.replicas = replicas
        self.rows = shape.slots // replicas  # this process's rows of every batch
        self.pad_id = self._pad_id()
        self.cache = self._cache()
        device_rows = strategy.place_rows
        rows, new = self.rows, shape.max_new_tokens
        self.mask = device_rows(torch.zeros(rows, shape.max_length, dtype=torch.long))
        self.state = {
            "last": device_rows(torch.zeros(rows, dtype=torch.long)),  # each row's last token
            "position": device_rows(torch.zeros(rows, dtype=torch.long)),  # its next position id
            "number": device_rows(torch.zeros(rows, dtype=torch.long)),  # its prompt's number
            # Read by the host: whole on every device (a split tensor's read compiles a gather
            # each time).
            "done": ops.upload(torch.zeros(rows, dtype=torch.bool)),
            "tokens": ops.upload(torch.full((rows, new), self.pad_id, dtype=torch.long)),
            # (laid out whole below)
            "step": ops.upload(torch.zeros((), dtype=torch.long)),
            "slot": ops.upload(torch.zeros((), dtype=torch.long)),  # the cache position
        }
        for read in ("tokens", "done"):
            strategy.keep_whole(self.state[read])
        strategy.settle(self._state_tensors())
        ops.sync()
        state = self._state_tensors
        # The prefill runs once a batch: where steps are traced lazily (torch_xla) it is traced
        # each time, over its cached graph, since it overwrites state its inputs alias.
        once = PREFILL_TRACED if ops.traced_lazily(self.mask) else None
        self.prefills = {
            bucket: ReplayedStep(self._prefill, state, self.host_read, once)
            for bucket in shape.buckets
        }
        self.decode = ReplayedStep(self._decode, state, self.host_read)
        self.timing = Timing()
        self.first_number = 0
        self.warmed = False

    # ---- set-up ---------------------------------------------------------------------
    def _pad_id(self) -> int:
        for name in ("pad_token_id", "eos_token_id"):
            value = getattr(self.tokenizer, name, None)
            if isinstance(value, int):
                return value
        return self.stop_ids[0] if self.stop_ids else 0

    def _cache(self) -> Any:
        from transformers import StaticCache
        from transformers.cache_utils import StaticLayer

        cache = StaticCache(config=self.config, max_cache_len=self.shape.max_length)
        odd = [type(layer).__name__ for layer in cache.layers if type(layer) is not StaticLayer]
        if odd:
            raise GenerationError(
                f"{self.config.model_type}'s cache has {odd[0]} layers (sliding windows or "
                "chunks), whose rolling cache the engine does not run: use a model of full "
                "attention layers"
            )
        heads = getattr(self.config, "num_key_value_heads", None) or self.config.num_attention_heads
        head_dim = getattr(self.config, "head_dim", None) or (
            self.config.hidden_size // self.config.num_attention_heads
        )
        dtype = next(p.dtype for p in self.model.parameters() if p.is_floating_point())
        local = self.strategy.local_heads(heads)
        shape = (self.rows, local, self.shape.max_length, head_dim)
        layers: list[Any] = list(cache.layers)
        for layer in layers:
            # What StaticLayer.lazy_initialization sets, allocated here once and laid out.
            layer.dtype, layer.batch_size, layer.num_heads = dtype, self.rows, local
            layer.k_head_dim = layer.v_head_dim = head_dim
            layer.keys = self.strategy.place_rows(torch.zeros(shape, dtype=dtype))
            layer.values = self.strategy.place_rows(torch.zeros(shape, dtype=dtype))
            layer.device = layer.keys.device
            layer.cumulative_length = ops.upload(torch.zeros((), dtype=torch.long))
            layer.is_initialized = True
        return cache

    def _state_tensors(self) -> list[torch.Tensor]:
        """Everything the compiled steps read or update: the model, the cache, the rows."""
        tensors = [*self.model.parameters(), *self.model.buffers(), self.mask]
        for layer in self.cache.layers:
            tensors += [layer.keys, layer.values, layer.cumulative_length]
        return tensors + list(self.state.values())

    # ---- the compiled steps -----------------------------------------------------------
    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, slot: torch.Tensor) -> Any:
        """The last position's logits of `ids` [rows, n] written to the cache from `slot`."""
        cache_position = slot + torch.arange(ids.shape[1], device=ids.device)
        out = self.model(
            input_ids=ids,
            attention_mask=self.mask,
            position_ids=positions,
            past_key_values=self.cache,
            cache_position=cache_position,
            use_cache=True,
            logits_to_keep=1,
        )
        drop_router_numbers(self.model)
        return out.logits[:, -1]

    def _choose(self, logits: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        """The next tokens, and each row's end flag folded in (an ended row draws padding)."""
        state = self.state
        chosen = next_tokens(logits, self.sampling, state["number"], step)
        chosen = torch.where(state["done"], torch.full_like(chosen, self.pad_id), chosen)
        state["tokens"].index_copy_(1, step.reshape(1), chosen[:, None])
        if self.stop_ids:
            ends = torch.tensor(self.stop_ids, dtype=chosen.dtype, device=chosen.device)
            state["done"].copy_(state["done"] | (chosen[:, None] == ends[None, :]).any(dim=-1))
        state["last"].copy_(chosen)
        return chosen

    def _keep_layouts(self) -> None:
        """The state as it was laid out at the start: each run of a step reads it alike."""
        rows = [self.mask, self.state["last"], self.state["position"], self.state["number"]]
        for layer in self.cache.layers:
            rows += [layer.keys, layer.values]
        for tensor in rows:
            self.strategy.keep_rows(tensor)
        for read in ("tokens", "done"):  # what the host reads, whole
            self.strategy.keep_whole(self.state[read])

    @torch.no_grad()
    def _prefill(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        state = self.state
        ids, mask = inputs["ids"], inputs["mask"]
        for layer in self.cache.layers:
            layer.cumulative_length.zero_()
        self.mask.zero_()
        self.mask[:, : ids.shape[1]] = mask
        positions = (mask.cumsum(dim=1) - 1).masked_fill(mask == 0, 1)
        state["number"].copy_(inputs["number"])
        state["done"].copy_(inputs["number"] < 0)  # an empty row has ended already
        state["tokens"].fill_(self.pad_id)
        state["step"].zero_()
        logits = self._forward(ids, positions, torch.zeros_like(state["slot"]))
        chosen = self._choose(logits, state["step"])
        state["position"].copy_(positions[:, -1] + 1)
        state["slot"].fill_(ids.shape[1])
        self._keep_layouts()
        return chosen

    @torch.no_grad()
    def _decode(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        state = self.state
        slot = state["slot"]
        self.mask.index_fill_(1, slot.reshape(1), 1)
        logits = self._forward(state["last"][:, None], state["position"][:, None], slot)
        state["step"].add_(1)
        chosen = self._choose(logits, state["step"])
        state["position"].add_(1)
        slot.add_(1)
        self._keep_layouts()
        return chosen

    # ---- the host's loop --------------------------------------------------------------
    def warm_up(self) -> None:
        """Compile every bucket's prefill and the decode step (each traced as the compiled
        step needs: twice on torch_xla), on empty rows."""
        if self.warmed:
            return
        # The decode step's two traces come first, one after the other (on the state as
        # built: the values do not matter here); then each bucket's prefill, as it runs in
        # use, after decode steps (its graph reads the state they leave).
        with hf.generation_mode(self.model):
            for _ in range(2):
                self.decode({})
                ops.sync()
            for bucket in self.shape.buckets:
                empty = _Batch([-1] * self.rows, [[self.pad_id]] * self.rows, bucket)
                self._run_batch(empty, 2)
        self.warmed = True

    def generate(self, prompts: Sequence[Sequence[int]], first_number: int = 0) -> list[Completion]:
        """Every prompt's completion, in order: `slots` prompts a batch (every process gets
        the whole list; each runs its rows of each batch and the results are exchanged).
        Prompt `i` samples with the noise of number `first_number + i` (a run that samples
        again and again numbers its calls apart: the same prompt then draws other tokens)."""
        self.warm_up()
        self.timing = Timing()
        self.first_number = first_number
        for index, prompt in enumerate(prompts):
            if not prompt:
                raise GenerationError(f"prompt {index} is empty: give it at least one token")
            self.shape.bucket(len(prompt))  # refused before anything runs
        results: dict[int, Completion] = {}
        slots = self.shape.slots
        with hf.generation_mode(self.model):
            for start in range(0, len(prompts), slots):
                results.update(self._run_slots(prompts, start))
        gathered = self._exchange(results)
        return [gathered[index] for index in range(len(prompts))]

    def _run_slots(self, prompts: Sequence[Sequence[int]], start: int) -> dict[int, Completion]:
        """This process's rows of the batch of `slots` prompts from `start`."""
        batch = list(range(start, min(start + self.shape.slots, len(prompts))))
        mine = batch[self.rank * self.rows : (self.rank + 1) * self.rows]
        numbers = mine + [-1] * (self.rows - len(mine))
        rows = [list(prompts[n]) if n >= 0 else [self.pad_id] for n in numbers]
        bucket = self.shape.bucket(max(len(prompts[n]) for n in batch))
        done = self._run_batch(_Batch(numbers, rows, bucket), self.shape.max_new_tokens)
        self.timing.batches += 1
        return done

    def _run_batch(self, batch: _Batch, new_tokens: int) -> dict[int, Completion]:
        shape = self.shape
        ids = torch.full((self.rows, batch.bucket), self.pad_id, dtype=torch.long)
        mask = torch.zeros((self.rows, batch.bucket), dtype=torch.long)
        for row, prompt in enumerate(batch.prompts):  # left-padded: every row ends at `bucket`
            ids[row, batch.bucket - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[row, batch.bucket - len(prompt) :] = 1
        first = self.first_number
        numbers = [number + first if number >= 0 else -1 for number in batch.numbers]
        inputs = {
            "ids": self.strategy.place_rows(ids),
            "mask": self.strategy.place_rows(mask),
            "number": self.strategy.place_rows(torch.tensor(numbers, dtype=torch.long)),
        }
        started = time.perf_counter()
        self.prefills[batch.bucket](inputs)
        ops.sync()
        stopped = [n < 0 for n in batch.numbers]
        tokens: list[list[int]] = [[] for _ in batch.numbers]
        generated = 1
        if self.warmed and self.timing.batches == 0:
            ops.wait()
            self.timing.first_token_s = time.perf_counter() - started
        decode_started = time.perf_counter()
        while generated < new_tokens:
            self.decode({})
            ops.sync()
            generated += 1
            self.timing.steps += 1
            if generated % shape.check_every == 0 and generated < new_tokens:
                tokens, ended = self._read()
                now = self._stopped(tokens, ended)
                stopped = [a or b for a, b in zip(stopped, now, strict=True)]
                if all(stopped):
                    break
        tokens, ended = self._read()
        if self.warmed:
            self.timing.decode_s += time.perf_counter() - decode_started
        completions: dict[int, Completion] = {}
        for row, number in enumerate(batch.numbers):
            if number >= 0:
                completions[number] = self._completion(batch.prompts[row], tokens[row], generated)
                self.timing.generated += len(completions[number].tokens)
        return completions

    def _read(self) -> tuple[list[list[int]], list[bool]]:
        """The generated tokens and end flags of every row: one transfer."""
        with self.host_read():
            tokens, done = ops.read_tensors([self.state["tokens"], self.state["done"]])
        self.timing.reads += 1
        return tokens.tolist(), done.tolist()

    def _stopped(self, tokens: list[list[int]], ended: list[bool]) -> list[bool]:
        if not self.stop_strings:
            return ended
        texts = self.tokenizer.batch_decode(tokens, skip_special_tokens=False)
        found = [any(stop in text for stop in self.stop_strings) for text in texts]
        return [a or b for a, b in zip(ended, found, strict=True)]

    def _completion(self, prompt: list[int], row: list[int], generated: int) -> Completion:
        """A row's tokens up to (and with) its end id, its text up to its first stop string."""
        kept = row[:generated]
        reason = "length"
        for index, token in enumerate(kept):
            if token in self.stop_ids:
                kept, reason = kept[: index + 1], "stop"
                break
        text = self.tokenizer.decode(kept, skip_special_tokens=True)
        for stop in self.stop_strings:
            if stop in text:
                text, reason = text[: text.index(stop)], "stop"
        return Completion(len(prompt), kept, text, reason)

    def _exchange(self, mine: dict[int, Completion]) -> dict[int, Completion]:
        return gather_rows(mine, self.replicas)


def gather_rows(mine: dict[int, Any], replicas: int) -> dict[int, Any]:
    """Every replica's results by their index in the request, from this replica's."""
    if replicas == 1:
        return mine
    from ..core import host_exchange, runtime

    merged: dict[int, Any] = {}
    for part in host_exchange.all_gather_objects(mine, runtime.host_group()):
        merged.update(part)
    return merged


def cache_bytes_per_device(
    config: Any, slots: int, max_length: int, batch_shards: int, tensor: int, value_bytes: int
) -> int:
    """Bytes of the static key/value cache on each device: `slots` rows of `max_length`
    tokens over `batch_shards` devices of the batch axes, heads over `tensor` (where it
    divides them), for a model of `config`."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    rows = -(-slots // batch_shards)
    heads_held = heads // tensor if tensor > 1 and heads % tensor == 0 else heads
    layers = text.num_hidden_layers
    return math.prod((2, layers, rows, heads_held, max_length, head_dim, value_bytes))
