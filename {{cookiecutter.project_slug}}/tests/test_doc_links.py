"""The README and docs/ link only to what the project has: its files, and headings in them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from urllib.parse import unquote

import pytest
from markdown_it import MarkdownIt

from readme_inventory import PROJECT, documentation

MARKDOWN = MarkdownIt("commonmark").enable("table")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, mailto:, gs:, ...
PAGES = documentation()
IDS = [page.relative_to(PROJECT).as_posix() for page in PAGES]


def relative_links(page: Path) -> Iterator[tuple[str, str]]:
    """(path, anchor) of every link of a page that is not a URL; path "" is the page itself."""
    for block in MARKDOWN.parse(page.read_text()):
        for token in block.children or ():
            href = str(token.attrGet("href") or "") if token.type == "link_open" else ""
            if href and not SCHEME.match(href):
                path, _, anchor = unquote(href).partition("#")
                yield path, anchor


def github_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces
    as hyphens, a repeated heading numbered."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    tokens = MARKDOWN.parse(page.read_text())
    for opening, inline in pairwise(tokens):
        if opening.type != "heading_open":
            continue
        words = (child for child in inline.children or () if child.type in {"text", "code_inline"})
        text = "".join(word.content for word in words)
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_relative_link_names_a_file_of_the_project(page: Path) -> None:
    """It finds, inside the project, the file each relative link of the page points to."""
    broken = []
    for path, _ in relative_links(page):
        target = (page.parent / path).resolve()
        if path and (not target.exists() or not target.is_relative_to(PROJECT)):
            broken.append(path)
    assert not broken, f"{page.relative_to(PROJECT)} links to what the project lacks: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_anchor_names_a_heading_of_its_page(page: Path) -> None:
    """It finds the heading each `#anchor` of the page names, by GitHub's anchor for it."""
    broken = []
    for path, anchor in relative_links(page):
        target = (page.parent / path).resolve() if path else page
        if anchor and (not target.is_file() or anchor not in github_anchors(target)):
            broken.append(f"{path}#{anchor}")
    assert not broken, f"{page.relative_to(PROJECT)} names headings that do not exist: {broken}"
