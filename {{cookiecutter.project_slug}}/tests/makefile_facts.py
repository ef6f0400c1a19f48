"""What the project's Makefile offers: its targets, the variables each target reads, and the
commands a target runs with given variables (`make -n`, make's own expansion)."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from docs_claims import ENV_ASSIGNMENT, is_placeholder

ASSIGNMENT = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*(?:\?=|::=|:=|\+=|=)(.*)$")
RULE = re.compile(r"^([^\s:=#][^:=]*?)\s*:(?![:=])(.*)$")
REFERENCE = re.compile(r"\$[({]([A-Za-z_][A-Za-z0-9_]*)[)}]")
RECURSION = re.compile(r"\$[({]MAKE[)}]([^;&|]*)")
# The ARGS value `expand` hands make, found again in the commands it prints.
ARGS_MARK = "@DOCS_ARGS@"


@dataclass
class Rule:
    prerequisites: list[str] = field(default_factory=list)
    recipe: list[str] = field(default_factory=list)


@dataclass
class Makefile:
    """The project's Makefile, read as text (nothing of it runs until `expand`)."""

    path: Path

    @cached_property
    def _parsed(self) -> tuple[dict[str, str], dict[str, Rule]]:
        definitions: dict[str, str] = {}
        rules: dict[str, Rule] = {}
        current: list[Rule] = []
        lines = re.sub(r"\\\n", " ", self.path.read_text()).splitlines()
        defining = ""
        for line in lines:
            if defining:
                if line.strip() == "endef":
                    defining = ""
                else:
                    definitions[defining] += line + "\n"
                continue
            if line.startswith("\t"):
                for rule in current:
                    rule.recipe.append(line[1:])
                continue
            if line.startswith("define "):
                defining = line.split()[1]
                definitions[defining] = ""
                continue
            assigned = ASSIGNMENT.match(line)
            if assigned:
                name, value = assigned.groups()
                definitions[name] = definitions.get(name, "") + " " + value
                current = []
                continue
            ruled = RULE.match(line)
            if ruled and not line.startswith("."):
                names, rest = ruled.groups()
                prerequisites = rest.split("##", 1)[0].split()
                current = [rules.setdefault(name, Rule()) for name in names.split()]
                for rule in current:
                    rule.prerequisites += prerequisites
            elif line.strip() and not line.startswith("#"):
                current = []
        return definitions, rules

    @property
    def targets(self) -> set[str]:
        """Every target a user can name (file targets like `$(BIN)/python` aside)."""
        return {name for name in self._parsed[1] if "$" not in name}

    def recursive(self, target: str) -> bool:
        """True where the target's recipe (or a prerequisite's) runs make again: `make -n`
        runs those lines, so `expand` refuses them."""
        return any(RECURSION.search(line) for line in self._recipes(target))

    def _rules_of(self, target: str, seen: set[str] | None = None) -> list[str]:
        """The target and every rule it needs: prerequisites, and targets `$(MAKE)` runs."""
        seen = set() if seen is None else seen
        rules = self._parsed[1]
        if target in seen or target not in rules:
            return []
        seen.add(target)
        found = [target]
        rule = rules[target]
        needed = list(rule.prerequisites)
        for line in rule.recipe:
            for called in RECURSION.findall(line):
                needed += [word for word in called.split() if word in rules]
        for name in needed:
            found += self._rules_of(name, seen)
        return found

    def _recipes(self, target: str) -> list[str]:
        rules = self._parsed[1]
        return [line for name in self._rules_of(target) for line in rules[name].recipe]

    def reads(self, target: str) -> set[str]:
        """The variables a target's commands read: its recipe's, its prerequisites' and those
        of the variables they use, all the way down."""
        rules = self._parsed[1]
        text = " ".join(
            " ".join([*rules[name].prerequisites, *rules[name].recipe])
            for name in self._rules_of(target)
        )
        return self._closure(REFERENCE.findall(text))

    def read_anywhere(self) -> set[str]:
        """Every variable some target or definition reads."""
        return set().union(*(self.reads(target) for target in self._parsed[1]))

    def _closure(self, names: list[str]) -> set[str]:
        definitions = self._parsed[0]
        found: set[str] = set()
        pending = list(names)
        while pending:
            name = pending.pop()
            if name not in found:
                found.add(name)
                pending += REFERENCE.findall(definitions.get(name, ""))
        return found

    def expand(self, targets: list[str], variables: dict[str, str]) -> list[str]:
        """The shell lines `make -n` prints for the targets with these variables, ARGS given
        as ARGS_MARK; RuntimeError with make's message where make refuses. GCLOUD is `false`
        unless given, so that no expansion asks Google Cloud anything."""
        given = {"GCLOUD": "false", **variables}
        assignments = [f"{name}={value}" for name, value in given.items()]
        done = subprocess.run(
            ["make", "-n", "--no-print-directory", *targets, *assignments, f"ARGS={ARGS_MARK}"],
            cwd=self.path.parent,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if "***" in line]
            raise RuntimeError((errors or done.stderr.splitlines() or ["make failed"])[-1])
        return re.sub(r"\\\n", " ", done.stdout).splitlines()


def make_words(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """A make command line's targets and `VAR=value` assignments (make's own flags aside)."""
    targets, variables, skip = [], {}, False
    for word in args:
        if skip:
            skip = False
        elif word.startswith("-"):
            skip = word in ("-C", "-f", "-j", "-I", "-o", "-W")
        elif ENV_ASSIGNMENT.match(word):
            name, _, value = word.partition("=")
            variables[name] = value
        elif not is_placeholder(word):
            targets.append(word)
    return targets, variables
