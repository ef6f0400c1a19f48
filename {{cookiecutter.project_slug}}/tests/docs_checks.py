"""The claims of a README or docs/ page (tests/docs_claims.py) held against this project's code
(tests/docs_project.py): what tests/test_docs_match_code.py runs on every page.

`python tests/docs_checks.py` prints what it held in every page, and what the code refuses.
"""

from __future__ import annotations

import re
import sys
from collections import Counter

from docs_claims import (
    BLOCK,
    INLINE,
    MENTION,
    Snippet,
    named_paths,
    simple_commands,
    snippets,
    words_of,
)
from docs_commands import CommandChecks
from docs_project import Project
from docs_report import Report


class PageCheck(CommandChecks):
    """Every claim of one page: its paths, command lines, config fragments."""

    def run(self, text: str) -> Report:
        for snippet in snippets(text):
            self.line = snippet.line
            if snippet.kind != "toml":
                for path in named_paths(snippet.text, (self.project.slug, self.project.package)):
                    self.count("paths")
                    if not self.project.has(path):
                        self.fail("paths", path, "the project has no such file or folder")
            if snippet.refused:
                self.count("refused-section snippets")  # shown as refused: not held as taken
            elif snippet.kind == "toml":
                self.toml_block(snippet.text)
            elif snippet.kind == "bash":
                self.shell(snippet.text, BLOCK)
            else:
                self.inline(snippet)
        return self.report

    def inline(self, snippet: Snippet) -> None:
        text = snippet.text.strip()
        if text.startswith("--set "):
            self.config(words_of(text)[1::2], {}, None, INLINE)
        elif re.match(r"[A-Za-z_][\w.]*\s*=\s*\S", text):
            self.inline_fragment(text)
        else:
            for command in simple_commands(words_of(text, pipes=False)):
                if len(command) > 1 and command[0].split("|")[0] in self.project.cli.commands:
                    self.cli(command, MENTION)  # `eval --checkpoint`: a command, named
                elif self.is_command(command):
                    self.command(command, INLINE)


def check_page(project: Project, text: str, page: str) -> Report:
    """Every claim of a page's Markdown text, held against the project."""
    check = PageCheck(project, page)
    check.run(text)
    return check.report


def main() -> int:
    from readme_inventory import PROJECT, documentation

    project = Project(PROJECT)
    total: Counter[str] = Counter()
    failures = []
    for path in documentation():
        name = path.relative_to(PROJECT).as_posix()
        report = check_page(project, path.read_text(), name)
        total.update(report.counts)
        failures += report.failures
    print("checked:", ", ".join(f"{n} {what}" for what, n in sorted(total.items())))
    for failure in failures:
        print(failure)
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
