"""A config table (`[dpo]`, `[grpo]`) read into its settings' dataclass."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")


def from_table(cls: type[T], table: dict[str, Any], section: str, error: type[ValueError]) -> T:
    """`cls` built from `table`, checked (its `check()`); an unknown key or a wrong value is
    refused as `error`, naming the key."""
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(table) - known)
    if unknown:
        names = ", ".join(sorted(known))
        raise error(f"unknown {section} option {unknown[0]!r}: {section} takes {names}")
    try:
        settings = cls(**table)
    except TypeError as failed:
        raise error(f"{section}: {failed}") from None
    settings.check()  # type: ignore[attr-defined]
    return settings
