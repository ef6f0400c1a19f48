"""What a README or docs/ page claims, read from its Markdown: the lines of its bash blocks, its
TOML blocks, its inline code spans, the shell commands in them and the project files named.

Nothing here knows the project's code; tests/docs_checks.py holds the claims against it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from markdown_it import MarkdownIt

MARKDOWN = MarkdownIt("commonmark").enable("table")
# Where a command line was written: a bash block; inline code that starts with a program
# (`tpu-project eval ...`) or with one of the project's commands (`eval --checkpoint`, named
# rather than run); a command line inside another (`pod run -- "..."`, `make`'s expansion).
BLOCK, INLINE, MENTION, NESTED = "block", "inline", "mention", "nested"
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SEPARATORS = {"&&", "||", ";", "|", "&"}
# Folders of the project, and subpackages of its package (core/ means src/<package>/core/).
PROJECT_FOLDERS = ("src", "tests", "benchmarks", "configs", "scripts", "docs")
PACKAGE_FOLDERS = (
    "core", "training", "hf", "data", "weights", "planning", "pod", "spot", "goodput", "tasks",
)  # fmt: skip
PROJECT_FILES = ("Makefile", "Dockerfile", "pyproject.toml", "README.md", ".pre-commit-config.yaml")
_FOLDERS = "|".join(PROJECT_FOLDERS + PACKAGE_FOLDERS)
# A path starts a word: not inside a URL, an absolute path, ~/..., runs/..., $VAR/... .
_START = r"(?<![\w./~$:@%-])(?:\./)?"
FOLDER_PATH = re.compile(_START + rf"((?:{_FOLDERS})/[\w./*-]*)")
_NAMES = "|".join(map(re.escape, PROJECT_FILES))
FILE_NAME = re.compile(_START + rf"([\w-]+\.(?:py|sh)|{_NAMES})(?![\w/.-])")
# A heading that says its section shows what the code refuses ("Not offered on this backend").
REFUSED_SECTION = re.compile(r"not offered|refused|unsupported|not supported", re.IGNORECASE)
# A file the page has the reader write: `configs/my-task.toml`, `my_task.py`, `mine.toml`.
READERS_OWN = re.compile(r"^(my[-_]|mine\.)")


@dataclass(frozen=True)
class Snippet:
    """A piece of a page: a bash line (continuations joined), a TOML block, an inline span."""

    line: int
    text: str
    kind: str  # "bash", "toml" or "inline"
    refused: bool = False  # in a section that shows what the code refuses


def snippets(text: str) -> list[Snippet]:
    """Every bash line, TOML block and inline code span of a Markdown text, in order."""
    lines = text.splitlines()
    found: list[Snippet] = []
    tokens = MARKDOWN.parse(text)
    refused = False
    for index, token in enumerate(tokens):
        at = (token.map or (0, 0))[0]  # 0-based: the fence's line, or the paragraph's first
        if token.type == "heading_open":
            refused = bool(REFUSED_SECTION.search(tokens[index + 1].content))
        elif token.type == "fence" and token.info.strip() == "bash":
            found += bash_lines(token.content, at + 2, refused)
        elif token.type == "fence" and token.info.strip() == "toml":
            found.append(Snippet(at + 2, token.content, "toml", refused))
        for child in token.children or ():
            if child.type == "code_inline":
                at = _line_of(child.content, lines, at)
                found.append(Snippet(at + 1, child.content, "inline", refused))
    return found


def _line_of(span: str, lines: list[str], start: int) -> int:
    """The line (0-based) where an inline span starts: the first from `start` that shows its
    first word after a backtick."""
    head = (span.split() or [span])[0]
    for number in range(start, len(lines)):
        if f"`{head}" in lines[number] or f"`` {head}" in lines[number]:
            return number
    return start


def bash_lines(block: str, first: int, refused: bool = False) -> list[Snippet]:
    """A bash block's command lines, continuations joined and comments dropped."""
    found: list[Snippet] = []
    pending, start = "", first
    for number, line in enumerate(block.splitlines(), start=first):
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        command = without_comment(pending + line).strip()
        pending = ""
        if command:
            found.append(Snippet(start, command, "bash", refused))
    return found


def without_comment(line: str) -> str:
    """A shell line without its comment: `#` at the start of a word, outside quotes."""
    quote = ""
    for index, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index]
    return line


def words_of(text: str, pipes: bool = True) -> list[str]:
    """Shell words, the separators `&&`, `||`, `;` (and `|`, `&` where `pipes`) as words of
    their own; an unclosed quote is closed at the end (inline code quotes a command's start)."""
    for closing in ("", "'", '"'):
        lexer = shlex.shlex(text + closing, posix=True, punctuation_chars=";&|" if pipes else ";&")
        lexer.whitespace_split, lexer.commenters = True, ""
        try:
            return list(lexer)
        except ValueError:
            continue
    return text.split()


def simple_commands(words: list[str]) -> list[list[str]]:
    """The simple commands of a shell line's words, each without its leading `NAME=value`
    assignments and `sudo`."""
    commands: list[list[str]] = [[]]
    for word in words:
        if word in SEPARATORS:
            commands.append([])
        else:
            commands[-1].append(word)
    stripped = []
    for command in commands:
        while command and (ENV_ASSIGNMENT.match(command[0]) or command[0] == "sudo"):
            command = command[1:]
        if command:
            stripped.append(command)
    return stripped


def is_placeholder(word: str) -> bool:
    """A stand-in for a value the reader supplies: `...`, `<x>`, `DIR`, `TPU_NAME`, `$IMAGE`,
    `gs://...`, `KEY=VALUE`."""
    if "..." in word or "…" in word or re.search(r"<[^>]*>", word) or word.startswith("$"):
        return True
    return all(re.fullmatch(r"[A-Z][A-Z0-9_-]*", part) for part in word.split("=") if part)


def named_paths(text: str, project_names: tuple[str, ...] = ()) -> list[str]:
    """The project files a snippet names (rule in tests/test_docs_match_code.py's docstring);
    `project_names` (its slug, its package) are never the reader's own."""
    found = []
    for match in FOLDER_PATH.finditer(text):
        path = match.group(1).rstrip(".")
        head = path.split("/", 1)[0]
        if head in PACKAGE_FOLDERS and not re.search(r"(\.\w+|/)$", path):
            continue  # `data/corpus`: an output folder, not the data package
        found.append(path)
    found += [match.group(1) for match in FILE_NAME.finditer(text)]
    return [path for path in found if not readers_own(path, project_names)]


def readers_own(path: str, project_names: tuple[str, ...] = ()) -> bool:
    """A file the page asks the reader to write (READERS_OWN), or a stand-in
    (`TPU_NAME-S/...`): not one the project ships."""
    parts = [part for part in path.split("/") if part and part not in project_names]
    return any(READERS_OWN.match(part) or is_placeholder(part) for part in parts)
