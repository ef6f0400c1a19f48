"""What checking a page finds: each claim the code refuses, and how many it held of each kind."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

KINDS = ("flags", "config", "make", "paths", "rules")


@dataclass(frozen=True)
class Failure:
    """One claim of a page that the code refuses."""

    page: str
    line: int
    kind: str  # one of KINDS; "flags" also holds programs, subcommands and required options
    item: str
    why: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.kind}: {self.item}: {self.why}"


@dataclass
class Report:
    """What a page claims that the code refuses, and how many claims of each kind it checked."""

    failures: list[Failure] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    def of(self, kind: str) -> list[Failure]:
        return [failure for failure in self.failures if failure.kind == kind]


class ClaimCheck:
    """Checks of one page's claims: where they fail, and what they counted."""

    def __init__(self, project: Any, page: str) -> None:
        self.project, self.page = project, page
        self.report = Report()
        self.line = 0  # of the snippet being checked

    def fail(self, kind: str, item: str, why: str) -> None:
        self.report.failures.append(Failure(self.page, self.line, kind, item, why))

    def count(self, what: str, number: int = 1) -> None:
        self.report.counts[what] += number
