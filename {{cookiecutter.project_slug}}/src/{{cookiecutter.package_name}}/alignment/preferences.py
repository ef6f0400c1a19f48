"""Preference pairs in TRL's formats, as fixed-length records a static step reads.

A pair is `prompt` / `chosen` / `rejected`: plain text, or conversational (lists of
`{"role", "content"}` messages, through the tokenizer's chat template), or with an implicit
prompt (`chosen` and `rejected` alone: the prompt is their longest shared prefix, as TRL's
`extract_prompt` takes it). Each is tokenized as TRL's DPOTrainer tokenizes it: the prompt,
and the prompt followed by each completion (an end-of-sequence token added to plain-text
completions that lack it); the completion starts where those token lists part. A record is
`ids` [2, max_length] (chosen, then rejected: the prompt and its completion, right-padded)
and `mask` [2, max_length] (1 on the completion's tokens). A pair longer than `max_length`
keeps its start (TRL's `keep_start`): the prompt whole and the completion cut at the end; a
prompt that fills `max_length` leaves nothing to learn from and drops the pair (TRL drops it
too), counted and said in one line.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset

COLUMNS = ("prompt", "chosen", "rejected")


class PreferenceError(ValueError):
    """Preference data that cannot be read as pairs; the message says which and why."""


def conversational(value: Any) -> bool:
    """A list of messages (dicts with a role), as TRL's `is_conversational` tells it."""
    first = value[0] if isinstance(value, list) and value else None
    return isinstance(first, dict) and "role" in first


def with_prompt(example: dict[str, Any], where: str) -> dict[str, Any]:
    """The pair with its prompt: given, or the longest shared prefix of chosen and rejected."""
    missing = [column for column in ("chosen", "rejected") if column not in example]
    if missing:
        raise PreferenceError(
            f"{where}: a preference pair has no {missing[0]!r} column: give prompt, chosen "
            "and rejected (or chosen and rejected that share their prompt)"
        )
    if "prompt" in example:
        return example
    chosen, rejected = example["chosen"], example["rejected"]
    index = 0
    for index in range(min(len(chosen), len(rejected))):
        if chosen[index] != rejected[index]:
            if isinstance(chosen, str) and chosen[index - 1] == " ":  # TRL keeps the space out
                index -= 1
            break
    return {"prompt": chosen[:index], "chosen": chosen[index:], "rejected": rejected[index:]}


def _ids(tokenizer: Any, value: Any, generation_prompt: bool = False) -> list[int]:
    if conversational(value):
        made = tokenizer.apply_chat_template(
            value, tokenize=True, return_dict=True, add_generation_prompt=generation_prompt
        )
        return list(made["input_ids"])
    return list(tokenizer(text=value)["input_ids"])


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


@dataclass(frozen=True)
class Tokenized:
    """A pair's token ids: the prompt's, then each completion's after it."""

    prompt: list[int]
    chosen: list[int]
    rejected: list[int]


def tokenize_pair(tokenizer: Any, example: dict[str, Any]) -> Tokenized:
    """TRL's DPOTrainer's tokenization of one pair (see the module's docstring)."""
    prompt, chosen, rejected = (example[c] for c in COLUMNS)
    if conversational(prompt) or conversational(chosen):
        prompt_ids = _ids(tokenizer, prompt, generation_prompt=True)
        with_chosen = _ids(tokenizer, list(prompt) + list(chosen))
        with_rejected = _ids(tokenizer, list(prompt) + list(rejected))
    else:
        eos = tokenizer.eos_token or ""
        chosen = chosen if chosen.endswith(eos) else chosen + eos
        rejected = rejected if rejected.endswith(eos) else rejected + eos
        prompt_ids = _ids(tokenizer, prompt)
        with_chosen = _ids(tokenizer, prompt + chosen)
        with_rejected = _ids(tokenizer, prompt + rejected)
    length = min(_common(prompt_ids, with_chosen), _common(prompt_ids, with_rejected))
    return Tokenized(prompt_ids[:length], with_chosen[length:], with_rejected[length:])


def record(pair: Tokenized, max_length: int, pad_id: int) -> dict[str, torch.Tensor]:
    """`ids` and `mask` [2, max_length] of a pair, its start kept."""
    ids = torch.full((2, max_length), pad_id, dtype=torch.long)
    mask = torch.zeros((2, max_length), dtype=torch.long)
    for row, completion in enumerate((pair.chosen, pair.rejected)):
        tokens = (pair.prompt + completion)[:max_length]
        ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        start = min(len(pair.prompt), max_length)
        mask[row, start : len(tokens)] = 1
    return {"ids": ids, "mask": mask}


class Pairs(Dataset[dict[str, torch.Tensor]]):
    """Tokenized preference pairs as fixed-length records (see the module's docstring)."""

    def __init__(
        self, examples: Iterable[dict[str, Any]], tokenizer: Any, max_length: int, where: str
    ) -> None:
        pad = tokenizer.pad_token_id
        pad = tokenizer.eos_token_id if pad is None else pad
        self.records: list[dict[str, torch.Tensor]] = []
        dropped = same = 0
        for number, example in enumerate(examples, 1):
            pair = tokenize_pair(tokenizer, with_prompt(dict(example), f"{where}, pair {number}"))
            if len(pair.prompt) >= max_length:
                dropped += 1
                continue
            same += pair.chosen == pair.rejected
            self.records.append(record(pair, max_length, int(pad or 0)))
        if not self.records:
            raise PreferenceError(
                f"{where}: no preference pair fits max_length {max_length} (each prompt fills "
                "it): raise dpo.max_length"
            )
        if dropped:
            warnings.warn(
                f"{where}: {dropped} pair(s) dropped: their prompt fills max_length {max_length}",
                stacklevel=2,
            )
        if same:
            warnings.warn(
                f"{where}: {same} pair(s) have chosen equal to rejected: they teach nothing "
                "(their loss is constant)",
                stacklevel=2,
            )
        self.dropped, self.same = dropped, same

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.records[index]


def read_pairs(location: str) -> list[dict[str, Any]]:
    """The preference pairs of a JSON lines, JSON or Parquet file (`read_rows`)."""
    examples = read_rows(location, "preference pairs")
    for column in ("chosen", "rejected"):
        lacking = next((n for n, example in enumerate(examples, 1) if column not in example), 0)
        if lacking:
            raise PreferenceError(
                f"{location}: the preference data has no {column!r} column (example {lacking} "
                f"has {', '.join(sorted(examples[lacking - 1])) or 'nothing'}): give prompt, "
                "chosen and rejected"
            )
    return examples


def read_rows(location: str, what: str) -> list[dict[str, Any]]:
    """The rows of a JSON lines, JSON or Parquet file (local or any fsspec URL, gs://), each a
    dict; bad input is named by its line, `what` names the data in the message."""
    import fsspec

    try:
        with fsspec.open(location, "rb") as handle:
            raw = handle.read()
    except (FileNotFoundError, OSError, ValueError) as error:
        raise PreferenceError(f"cannot read {what} from {location!r}: {error}") from None
    if location.endswith(".parquet"):
        import io

        import pyarrow.parquet as pq

        try:
            examples = pq.read_table(io.BytesIO(raw)).to_pylist()
        except Exception as error:  # pyarrow raises its own kinds
            raise PreferenceError(f"{location}: not a Parquet file: {error}") from None
    else:
        examples = _json_examples(location, raw.decode("utf-8", errors="replace"), what)
    if not examples:
        raise PreferenceError(f"{location}: holds no {what}")
    return examples


def _json_examples(location: str, text: str, what: str) -> list[dict[str, Any]]:
    """A JSON array of objects, or one object per line."""
    import json

    if text.lstrip().startswith("["):
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as error:
            raise PreferenceError(f"cannot read {what} from {location!r}: {error}") from None
        rows = list(enumerate(loaded, 1))
    else:
        rows = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append((number, json.loads(line)))
            except json.JSONDecodeError as error:
                raise PreferenceError(
                    f"cannot read {what} from {location!r}: line {number} is not JSON ({error.msg})"
                ) from None
    for number, row in rows:
        if not isinstance(row, dict):
            raise PreferenceError(f"{location}: example {number} is not an object")
    return [row for _, row in rows]
