"""Prompts in, completions out: text from the command line or a file, JSON lines of
`{"prompt": ...}` or chat `{"messages": [...]}` (through the tokenizer's chat template), and
JSON lines of completions with their token counts."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .engine import Completion, GenerationError


@dataclass(frozen=True)
class Prompt:
    """One request: what the output line shows of it, and its token ids."""

    shown: Any  # the text, or the messages
    ids: list[int]


def read_prompts(texts: Sequence[str], path: Path | None, tokenizer: Any) -> list[Prompt]:
    """The `--prompt` texts, then the file's: one prompt per line of a `.txt`; a `.jsonl`'s
    lines each `{"prompt": text}` or `{"messages": [{"role": ..., "content": ...}, ...]}`."""
    prompts = [Prompt(text, encode(tokenizer, text)) for text in texts]
    if path is None:
        return prompts
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise GenerationError(f"cannot read prompts from {str(path)!r}: {error.strerror}") from None
    if path.suffix != ".jsonl":
        return prompts + [Prompt(line, encode(tokenizer, line)) for line in lines if line.strip()]
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise GenerationError(f"{path}:{number}: not JSON ({error.msg})") from None
        prompts.append(_record_prompt(record, tokenizer, f"{path}:{number}"))
    return prompts


def _record_prompt(record: Any, tokenizer: Any, where: str) -> Prompt:
    if isinstance(record, dict) and isinstance(record.get("prompt"), str):
        return Prompt(record["prompt"], encode(tokenizer, record["prompt"]))
    messages = record.get("messages") if isinstance(record, dict) else None
    if isinstance(messages, list) and messages:
        if getattr(tokenizer, "chat_template", None) is None:
            raise GenerationError(
                f"{where}: chat messages need a tokenizer with a chat template, and this "
                "model's has none: give a plain prompt"
            )
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict):  # a BatchEncoding
            ids = ids["input_ids"]
        return Prompt(messages, list(ids))
    shapes = '{"prompt": "..."} or {"messages": [{"role": "user", "content": "..."}]}'
    raise GenerationError(f"{where}: a line is " + shapes)


def encode(tokenizer: Any, text: str) -> list[int]:
    """A plain prompt's ids: the tokenizer's own special tokens first (a BOS), as its model
    was trained with them."""
    return list(tokenizer.encode(text))


def completion_record(prompt: Prompt, completion: Completion) -> dict[str, Any]:
    """One output line."""
    key = "messages" if isinstance(prompt.shown, list) else "prompt"
    return {
        key: prompt.shown,
        "completion": completion.text,
        "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": len(completion.tokens),
        "finish_reason": completion.finish_reason,
    }


def write_completions(
    path: Path | None, prompts: Sequence[Prompt], completions: Sequence[Completion]
) -> str:
    """The JSON lines of every completion, written whole to `path` (aside, then moved into
    place: never half a file) or returned for the terminal."""
    text = "".join(
        json.dumps(completion_record(p, c), ensure_ascii=False) + "\n"
        for p, c in zip(prompts, completions, strict=True)
    )
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    return text
