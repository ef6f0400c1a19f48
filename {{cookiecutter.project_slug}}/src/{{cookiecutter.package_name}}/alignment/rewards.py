"""Reward functions as TRL's `GRPOTrainer` calls them, named in the config.

`grpo.reward_funcs` names each as `module:function` (an importable module: `my_rewards:correct`)
or `path/to/file.py:function` (a file, relative to the working directory), or by the name of
one of the project's own (`BUILT_IN`):

- `math_answer`: 1.0 where the completion's answer is mathematically the row's `answer`
  (`math-verify`: LaTeX, fractions, decimals and expressions compared as values), 0.0 where
  it is not, None where the `answer` itself cannot be parsed (TRL's `accuracy_reward`);
- `exact_answer`: 1.0 where the completion, stripped, is the row's `answer` exactly, else 0.0.

Each is called once a step with every completion of the batch, as TRL calls a custom reward
function:

    function(prompts=[...], completions=[...], completion_ids=[[...], ...], **columns)

`prompts` and `completions` are strings (lists of messages for a conversational prompt: the
completion is then `[{"role": "assistant", "content": text}]`), and `columns` are the prompt
rows' other columns (`answer`, ...), one value per completion. It returns one float per
completion, or None where it does not apply (a completion every function skips gets no
advantage). A function that raises, or returns the wrong count, stops the run in one line
naming it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from .grpo import GrpoError

RewardFunction = Callable[..., Sequence[float | None]]


def _texts(completions: Sequence[Any]) -> list[str]:
    """A completion's text: itself, or a conversational completion's message's content."""
    return [c if isinstance(c, str) else c[-1]["content"] for c in completions]


def math_answer(
    completions: Sequence[Any], answer: Sequence[Any], **kwargs: Any
) -> list[float | None]:
    """1.0 where the completion's answer equals the row's `answer` as math-verify compares
    them, 0.0 where not, None where the `answer` cannot be parsed."""
    try:
        from math_verify import parse, verify
    except ImportError:
        raise GrpoError(
            "the math_answer reward needs math-verify: pip install math-verify"
        ) from None
    scores: list[float | None] = []
    for text, gold in zip(_texts(completions), answer, strict=True):
        wanted = parse(str(gold))
        scores.append(float(verify(wanted, parse(text))) if wanted else None)
    return scores


def exact_answer(completions: Sequence[Any], answer: Sequence[Any], **kwargs: Any) -> list[float]:
    """1.0 where the stripped completion is the row's `answer`, else 0.0."""
    texts = _texts(completions)
    return [
        float(text.strip() == str(gold).strip()) for text, gold in zip(texts, answer, strict=True)
    ]


BUILT_IN: dict[str, RewardFunction] = {"math_answer": math_answer, "exact_answer": exact_answer}


def load_reward(spec: str) -> tuple[str, RewardFunction]:
    """The reward function `spec` names, and its name as metrics show it."""
    if spec in BUILT_IN:
        return spec, BUILT_IN[spec]
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise GrpoError(
            f"grpo.reward_funcs: {spec!r} names no function: use module:function, "
            f"file.py:function or one of {', '.join(BUILT_IN)}"
        )
    try:
        module = _module(where)
    except GrpoError:
        raise
    except Exception as error:  # the user's module failed to import: say how, in one line
        raise GrpoError(f"grpo.reward_funcs: cannot import {where!r}: {error!r}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise GrpoError(f"grpo.reward_funcs: {where!r} has no function {name!r}")
    return name, function


def _module(where: str) -> Any:
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise GrpoError(f"grpo.reward_funcs: no such file {where!r}")
        label = f"_reward_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(label, path)
        if spec is None or spec.loader is None:
            raise GrpoError(f"grpo.reward_funcs: {where!r} is not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[label] = module
        spec.loader.exec_module(module)
        return module
    if importlib.util.find_spec(where) is None:
        raise GrpoError(f"grpo.reward_funcs: no module {where!r} (is it on the path?)")
    return importlib.import_module(where)


class Rewards:
    """The run's reward functions and their weights."""

    def __init__(self, specs: Sequence[str], weights: Sequence[float]) -> None:
        loaded = [load_reward(spec) for spec in specs]
        self.names = [name for name, _ in loaded]
        self.functions = [function for _, function in loaded]
        self.weights = torch.tensor(list(weights) or [1.0] * len(loaded), dtype=torch.float32)

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        completion_ids: list[list[int]],
        columns: dict[str, list[Any]],
    ) -> torch.Tensor:
        """[completions, functions] rewards (NaN: None)."""
        scores = torch.full((len(completions), len(self.functions)), math.nan)
        for index, (name, function) in enumerate(zip(self.names, self.functions, strict=True)):
            try:
                given = function(
                    prompts=prompts, completions=completions, completion_ids=completion_ids,
                    **_accepted(function, columns),
                )  # fmt: skip
                values = list(given)
            except Exception as error:  # a user's function: name it, in one line
                raise GrpoError(f"reward function {name!r} raised {error!r}") from None
            if len(values) != len(completions):
                raise GrpoError(
                    f"reward function {name!r} returned {len(values)} rewards for "
                    f"{len(completions)} completions: return one each (None where it does "
                    "not apply)"
                )
            for row, value in enumerate(values):
                if value is None:
                    continue
                try:
                    scores[row, index] = float(value)
                except (TypeError, ValueError):
                    raise GrpoError(
                        f"reward function {name!r} returned {value!r} for completion {row}: "
                        "return a float or None"
                    ) from None
        return scores


def _accepted(function: Callable[..., Any], columns: dict[str, list[Any]]) -> dict[str, Any]:
    """The columns `function` takes: all of them if it takes **kwargs, as TRL passes them."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return columns
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return columns
    names = {p.name for p in parameters}
    return {key: value for key, value in columns.items() if key in names}
