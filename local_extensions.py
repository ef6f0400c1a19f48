"""Jinja extensions of the template, loaded through `_extensions` in cookiecutter.json.

cookiecutter creates the project directory from `project_slug` before the
pre-generation hook runs, so a slug that is a path (`../x`, `a/b`) would create
folders before any hook could refuse it. `ProjectDirGuard` checks the slug at the
moment cookiecutter renders the directory's name, just before creating it: a slug
that is not one plain folder name stops the bake there, whether the answers came
from prompts, `--no-input` or `--replay-file`.
"""

from __future__ import annotations

import re
import sys

from jinja2 import Environment
from jinja2.ext import Extension

SEPARATORS = ("/", "\\")
# The name of the template's project directory, the only template that is exactly this.
PROJECT_DIR_NAME = re.compile(r"\{\{\s*cookiecutter\.project_slug\s*\}\}")
CHECKED_PROJECT_DIR_NAME = "{{ cookiecutter.project_slug | project_dir_name }}"


def path_problem(slug: str) -> str | None:
    """Say why a slug is not one folder name inside the output directory, or None."""
    if not slug.strip():
        return "is empty"
    if slug in (".", ".."):
        return "names the output directory or its parent"
    found = [sep for sep in SEPARATORS if sep in slug]
    if found:
        return f"contains a path separator ({' and '.join(map(repr, found))})"
    if not slug.isprintable():
        return "contains a control character"
    return None


def project_dir_name(slug: str) -> str:
    """Return the slug if it is one folder name; otherwise print one ERROR line and exit 1."""
    problem = path_problem(slug)
    if problem is None:
        return slug
    print(
        f"ERROR: project_slug {slug!r} {problem}, so the project would not be one folder "
        "inside the output directory; pass a name such as project_slug=my-model "
        "(lowercase letters, digits and hyphens)",
        file=sys.stderr,
        flush=True,
    )
    # Exits like the pre-generation hook does, but before cookiecutter creates anything.
    raise SystemExit(1)


class ProjectDirGuard(Extension):
    """Renders the project directory's name through `project_dir_name`."""

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        environment.filters["project_dir_name"] = project_dir_name

    def preprocess(self, source: str, name: str | None, filename: str | None = None) -> str:
        """Check the slug wherever a template is just the project directory's name."""
        if PROJECT_DIR_NAME.fullmatch(source):
            return CHECKED_PROJECT_DIR_NAME
        return source
