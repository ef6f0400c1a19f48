"""Commands shown in the README and docs/, and the README's inventory saying how each is checked."""

from __future__ import annotations

import re
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
README = PROJECT / "README.md"
DOCS = PROJECT / "docs"
REFERENCE = re.compile(r"(tested|rehearsed|template): (tests/[\w/]+\.py)::(\w+)")
ROW = re.compile(r"^\| `(?P<command>[^`]+)` \| (?P<how>.+) \|$")


def documentation() -> list[Path]:
    """The project's documentation files: the README first, then every docs/ page by name."""
    return [README, *sorted(DOCS.glob("*.md"))]


def readme_commands(text: str) -> list[str]:
    """Shell commands of a Markdown text's bash blocks (continuations joined, comments dropped)."""
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            command = re.split(r"\s{2,}#", line)[0].strip()
            if command and not re.fullmatch(r"[A-Z_]+=\S+", command):
                commands.append(command)
    return commands


def documented_commands() -> list[tuple[str, str]]:
    """(file, command) for every command of the README and the docs/ pages, in their order."""
    return [
        (path.relative_to(PROJECT).as_posix(), command)
        for path in documentation()
        for command in readme_commands(path.read_text())
    ]


def inventory(text: str) -> dict[str, str]:
    """Command prefix -> how it is checked, from the inventory table."""
    section = text.split("## Command inventory", 1)[1]
    return {m["command"]: m["how"] for m in map(ROW.match, section.splitlines()) if m}


def covering_row(command: str, rows: dict[str, str]) -> str | None:
    """The longest inventory prefix that the command starts with."""
    matches = [prefix for prefix in rows if command.startswith(prefix)]
    return max(matches, key=len) if matches else None


def references(how: str) -> list[tuple[str, str, str]]:
    """(kind, file, test name) triples named in an inventory row."""
    return REFERENCE.findall(how)
