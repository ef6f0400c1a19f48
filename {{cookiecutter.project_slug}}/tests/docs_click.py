"""What a click command takes, asked of its parameters (Typer's commands are click's, or
Typer's own copy of click's): its option names, which take a value, and the words of a
command line with a stand-in value made one click parses."""

from __future__ import annotations

import re
from typing import Any

from docs_claims import is_placeholder


def option_names(command: Any) -> set[str]:
    names = {"--help"}
    for param in command.params:
        if param.param_type_name == "option":
            names |= set(param.opts) | set(param.secondary_opts)
    return names


def leaves(group: Any) -> list[Any]:
    found = []
    for command in group.commands.values():
        found += leaves(command) if hasattr(command, "commands") else [command]
    return found


def takes_value(param: Any) -> bool:
    return param.param_type_name == "option" and not getattr(param, "is_flag", False)


def flag_words(args: list[str], command: Any = None) -> list[str]:
    """The words that are options (`--x`, `--x=v`, `-x`), not option values: a value of an
    option of `command` is skipped, even one that starts with a dash."""
    options = {name: p for p in (command.params if command else ()) for name in p.opts}
    found, skip = [], False
    for word in args:
        if skip:
            skip = False
            continue
        if word == "--":
            break
        if word.startswith("-") and len(word) > 1 and not re.match(r"-[\d.]", word):
            found.append(word)
            param = options.get(word)
            skip = param is not None and takes_value(param)
    return found


def with_dummy_values(command: Any, args: list[str]) -> list[str]:
    """The words with a placeholder value of a number option made a number (`--steps N`)."""
    options = {name: p for p in command.params for name in p.opts}
    out, expecting = [], None
    for word in args:
        if expecting is not None:
            out.append(dummy(expecting, word))
            expecting = None
            continue
        name, equals, value = word.partition("=")
        param = options.get(name)
        if param is not None and takes_value(param) and equals:
            word = f"{name}={dummy(param, value)}"
        elif param is not None and takes_value(param):
            expecting = param
        out.append(word)
    return out


def dummy(param: Any, value: str) -> str:
    if not is_placeholder(value):
        return value
    kind = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    name = getattr(getattr(param, "type", None), "name", "")
    if kind is int or name == "integer":
        return "1"
    if kind is float or name == "float":
        return "1.0"
    return value
