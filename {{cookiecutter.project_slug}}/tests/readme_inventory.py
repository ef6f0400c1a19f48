"""Commands shown in the README and the inventory saying how each is checked."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
REFERENCE = re.compile(r"(tested|rehearsed|template): (tests/[\w/]+\.py)::(\w+)")
ROW = re.compile(r"^\| `(?P<command>[^`]+)` \| (?P<how>.+) \|$")


def readme_commands(text: str) -> list[str]:
    """Shell commands of the README's bash blocks (continuations joined, comments dropped)."""
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            command = re.split(r"\s{2,}#", line)[0].strip()
            if command and not re.fullmatch(r"[A-Z_]+=\S+", command):
                commands.append(command)
    return commands


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
