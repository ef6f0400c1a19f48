"""Validate the answers before cookiecutter writes anything.

On a bad answer this prints one line, ``ERROR: <what is wrong>; <what to do>``,
to stderr and exits 1; cookiecutter then removes the half-made output. The
answers enter as data (JSON rendered by cookiecutter), never as code.
"""

# The rendered answers are read inside functions, so tests can import this file
# unrendered and call the checks directly. Everything from here to the
# `endraw` marker is shielded from Jinja because the messages mention its syntax.
# {% raw %}
from __future__ import annotations

import json
import keyword
import re
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# The table of TPU generations arrives with the answers (`_tpu_generations` in
# cookiecutter.json): slice sizes, runtime versions and zones per generation.
GENERATIONS_KEY = "_tpu_generations"
SIZE_RE = re.compile(r"[1-9][0-9]*")

PYTHON_VERSIONS = ("3.11", "3.10", "3.12")
PRECISIONS = ("32-true", "bf16-mixed", "bf16-true")
STRATEGIES = ("auto", "single", "ddp", "spmd", "fsdp")
EXAMPLE_TASKS = ("lm", "vision", "hf-causal-lm")
BACKENDS = ("torch_xla", "torch_tpu")
# What torch_tpu (TorchTPU 0.2) needs of the rest: Python 3.11 or newer, one process per
# device (no strategy that drives every device of a host from one process).
TORCH_TPU_PYTHONS = ("3.11", "3.12")
TORCH_TPU_STRATEGIES = ("auto", "single", "ddp", "fsdp")

# Import names the generated project, its tools or Python itself import (the
# stdlib's `test` package is missing from sys.stdlib_module_names); a package
# with one of these names would hide the real module.
DEPENDENCY_MODULES = frozenset(
    {
        "torch",
        "torch_xla",
        "torchvision",
        "libtpu",
        "jax",
        "test",
        "tests",
        "typer",
        "rich",
        "click",
        "numpy",
        "yaml",
        "tensorboard",
        "sklearn",
        "scipy",
        "pandas",
        "datasets",
        "transformers",
        "accelerate",
        "lightning",
        "pytorch_lightning",
        "setuptools",
        "pip",
        "pytest",
        "ruff",
        "mypy",
        "cookiecutter",
        "google",
        "src",
    }
)

TEMPLATE_MARKERS = ("{{", "{%", "{#")
SHELL_METACHARACTERS = frozenset("\"'`$;&|<>\\")
SLUG_RE = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")
PACKAGE_RE = re.compile(r"[a-z][a-z0-9_]*")
ZONE_RE = re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z]")
GCP_PROJECT_RE = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")
EMAIL_RE = re.compile(r"[^@\s\"'<>]+@[^@\s\"'<>]+")
DOCKER_IMAGE_RE = re.compile(r"[a-z0-9][a-z0-9._/:-]*(:[A-Za-z0-9_.-]+)?")

# Answers typed as plain text; cookiecutter renders them as Jinja when passed on
# the command line, so their raw form must not contain template syntax.
FREE_TEXT_KEYS = ("project_name", "description", "author_name", "author_email", "gcp_project")


class InvalidAnswer(ValueError):
    """An answer that cannot bake a working project; the message says what to do."""


def check_no_template_syntax(key: str, raw_value: str) -> None:
    """Refuse Jinja syntax in an answer that should be plain text."""
    if any(marker in raw_value for marker in TEMPLATE_MARKERS):
        raise InvalidAnswer(
            f"{key} {raw_value!r} contains template syntax ({{{{, {{% or {{#); "
            "write plain text without braces"
        )


def check_project_name(name: str) -> None:
    """Refuse an empty name or one with quotes, shell metacharacters or control characters."""
    if not name.strip():
        raise InvalidAnswer('project_name is empty; pass a name such as project_name="My Model"')
    check_no_template_syntax("project_name", name)
    bad = sorted({ch for ch in name if ch in SHELL_METACHARACTERS or not ch.isprintable()})
    if bad:
        raise InvalidAnswer(
            f"project_name {name!r} contains quotes or shell metacharacters "
            f"({', '.join(map(repr, bad))}); use letters, digits, spaces, hyphens and underscores"
        )


def check_project_slug(slug: str) -> None:
    """Require lowercase letters, digits and single hyphens, starting with a letter."""
    if not SLUG_RE.fullmatch(slug):
        raise InvalidAnswer(
            f"project_slug {slug!r} is not a valid slug; it must start with a lowercase "
            "letter and contain only lowercase letters, digits and single hyphens "
            "(change project_name or pass project_slug=my-model)"
        )


def check_slug_clash(slug: str) -> None:
    """Refuse a distribution name that is also one of the project's dependencies."""
    if slug.replace("-", "_") in DEPENDENCY_MODULES:
        raise InvalidAnswer(
            f"project_slug {slug!r} clashes with the distribution {slug!r} the project "
            "depends on or is tested with; pass another project_slug, e.g. project_slug=my-model"
        )


def check_package_name(package: str) -> None:
    """Require a lowercase identifier that is no keyword and shadows no module."""
    if not package.isidentifier() or not PACKAGE_RE.fullmatch(package):
        raise InvalidAnswer(
            f"package_name {package!r} is not a valid Python package name; it must start "
            "with a lowercase letter and contain only lowercase letters, digits and "
            "underscores (pass package_name=my_model)"
        )
    if keyword.iskeyword(package):
        raise InvalidAnswer(
            f"package_name {package!r} is a Python keyword and cannot be imported; "
            f"pass another package_name, e.g. package_name={package}_model"
        )
    if package in sys.stdlib_module_names:
        raise InvalidAnswer(
            f"package_name {package!r} would shadow the standard-library module "
            f"{package!r}; pass another package_name, e.g. package_name=my_{package}"
        )
    if package in DEPENDENCY_MODULES:
        raise InvalidAnswer(
            f"package_name {package!r} would shadow the {package!r} module that the "
            "project, its tools or Python itself import; pass another package_name, "
            f"e.g. package_name=my_{package}"
        )


def generation_of(accelerator: str) -> str:
    """Return the TPU generation of an accelerator type (``v4-32`` -> ``v4``)."""
    return accelerator.split("-", 1)[0]


def listed(values: list[int], most: int = 8) -> str:
    """Name a few allowed sizes: all of them when short, else the first ones and the largest."""
    if len(values) <= most:
        return ", ".join(map(str, values))
    return f"{', '.join(map(str, values[: most - 1]))}, ... {values[-1]}"


def check_accelerator_type(accelerator: str, generations: Mapping[str, Any]) -> None:
    """Require GENERATION-SIZE with a generation of the table and a size it allows."""
    generation, _, size = accelerator.partition("-")
    if generation not in generations:
        raise InvalidAnswer(
            f"accelerator_type {accelerator!r} is not a TPU type the template knows; "
            f"use GENERATION-SIZE with a generation among {', '.join(generations)} "
            "(v5e is v5litepod), e.g. v5litepod-8, v4-32, v5p-16"
        )
    sizes = list(generations[generation]["slice_sizes"])
    if not SIZE_RE.fullmatch(size) or int(size) not in sizes:
        example = f"{generation}-{sizes[min(2, len(sizes) - 1)]}"
        raise InvalidAnswer(
            f"accelerator_type {accelerator!r} is not a {generation} slice; "
            f"{generation} sizes are {listed(sizes)} (e.g. {example})"
        )


def check_runtime_version(runtime: str, accelerator: str, generations: Mapping[str, Any]) -> None:
    """Require a known runtime version that boots the accelerator's generation."""
    known = sorted({r for entry in generations.values() for r in entry["runtime_versions"]})
    if runtime not in known:
        raise InvalidAnswer(
            f"runtime_version {runtime!r} is unknown; choose one of {', '.join(known)}"
        )
    compatible = generations[generation_of(accelerator)]["runtime_versions"]
    if runtime not in compatible:
        raise InvalidAnswer(
            f"runtime_version {runtime!r} does not run on {accelerator}; "
            f"use {' or '.join(compatible)}"
        )


def check_zone(zone: str) -> None:
    """Require a Google Cloud zone shaped like ``us-central2-b``."""
    if not ZONE_RE.fullmatch(zone):
        raise InvalidAnswer(
            f"zone {zone!r} is not a Google Cloud zone; "
            "use the form region-zone, e.g. us-central2-b"
        )


def check_gcp_project(project: str) -> None:
    """Require a Google Cloud project id: 6-30 lowercase letters, digits or hyphens."""
    check_no_template_syntax("gcp_project", project)
    if not GCP_PROJECT_RE.fullmatch(project):
        raise InvalidAnswer(
            f"gcp_project {project!r} is not a Google Cloud project id; it must be 6-30 "
            "lowercase letters, digits or hyphens, start with a letter and not end with "
            "a hyphen (e.g. my-gcp-project)"
        )


def check_author_email(email: str) -> None:
    """Require something shaped like an e-mail address."""
    if not EMAIL_RE.fullmatch(email):
        raise InvalidAnswer(
            f"author_email {email!r} is not an e-mail address; pass author_email=you@example.com"
        )


def check_docker_image(image: str) -> None:
    """Require a non-empty lowercase image reference without spaces or shell characters."""
    if not DOCKER_IMAGE_RE.fullmatch(image):
        raise InvalidAnswer(
            f"docker_image {image!r} is not a Docker image name; use lowercase "
            "registry/path[:tag] without spaces, "
            "e.g. us-docker.pkg.dev/my-gcp-project/my-model/train"
        )


def check_single_line(key: str, value: str) -> None:
    """Refuse line breaks and control characters in one-line answers."""
    if not value.isprintable():
        raise InvalidAnswer(
            f"{key} {value!r} contains a line break or control character; use one line"
        )


def check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    """Require one of the listed choices."""
    if value not in choices:
        raise InvalidAnswer(f"{key} {value!r} is not supported; choose one of {', '.join(choices)}")


def check_backend(
    backend: str,
    accelerator: str,
    generations: Mapping[str, Any],
    python_version: str,
    strategy: str,
) -> None:
    """Refuse what the chosen backend cannot do: a generation, a Python, a strategy."""
    check_choice("backend", backend, BACKENDS)
    entry = generations.get(generation_of(accelerator), {})
    able = entry.get("backends", ["torch_xla"])
    if backend not in able:
        raise InvalidAnswer(
            f"backend {backend!r} does not run {entry.get('name', accelerator)} "
            f"({accelerator}); use backend={able[0]}, or a generation it runs "
            "(v4, v5litepod, v5p, v6e, tpu7x)"
        )
    if backend == "torch_tpu" and python_version not in TORCH_TPU_PYTHONS:
        raise InvalidAnswer(
            f"backend 'torch_tpu' needs Python 3.11 or newer (TorchTPU's own requirement), "
            f"not {python_version}; pass python_version=3.11"
        )
    if backend == "torch_tpu" and strategy not in TORCH_TPU_STRATEGIES:
        raise InvalidAnswer(
            f"strategy {strategy!r} is torch_xla's (one process drives every device of a "
            "host); torch_tpu runs one process per device: choose one of "
            f"{', '.join(TORCH_TPU_STRATEGIES)}"
        )


def validate(answers: Mapping[str, Any], raw_answers: Mapping[str, Any] | None = None) -> None:
    """Check every answer in the order a user reads them; raise on the first problem."""
    for key in FREE_TEXT_KEYS:
        raw = (raw_answers or {}).get(key)
        if isinstance(raw, str):
            check_no_template_syntax(key, raw)
    accelerator = answers["accelerator_type"]
    generations = answers[GENERATIONS_KEY]
    checks: list[Callable[[], None]] = [
        lambda: check_project_name(answers["project_name"]),
        lambda: check_project_slug(answers["project_slug"]),
        lambda: check_package_name(answers["package_name"]),
        lambda: check_slug_clash(answers["project_slug"]),
        lambda: check_single_line("description", answers["description"]),
        lambda: check_no_template_syntax("description", answers["description"]),
        lambda: check_single_line("author_name", answers["author_name"]),
        lambda: check_no_template_syntax("author_name", answers["author_name"]),
        lambda: check_author_email(answers["author_email"]),
        lambda: check_accelerator_type(accelerator, generations),
        lambda: check_zone(answers["zone"]),
        lambda: check_gcp_project(answers["gcp_project"]),
        lambda: check_runtime_version(answers["runtime_version"], accelerator, generations),
        lambda: check_docker_image(answers["docker_image"]),
        lambda: check_choice("precision", answers["precision"], PRECISIONS),
        lambda: check_choice("strategy", answers["strategy"], STRATEGIES),
        lambda: check_choice("example_task", answers["example_task"], EXAMPLE_TASKS),
        lambda: check_choice("python_version", answers["python_version"], PYTHON_VERSIONS),
        lambda: check_backend(
            answers.get("backend", "torch_xla"),
            accelerator,
            generations,
            answers["python_version"],
            answers["strategy"],
        ),
    ]
    for check in checks:
        check()


def run(answers: Mapping[str, Any], raw_answers: Mapping[str, Any] | None = None) -> int:
    """Validate, print the single ERROR line on failure, and return the exit code."""
    try:
        validate(answers, raw_answers)
    except InvalidAnswer as error:
        print(f"ERROR: {error}", file=sys.stderr, flush=True)
        return 1
    except KeyError as error:
        print(
            f"ERROR: answer {error} is missing; bake from the template's cookiecutter.json",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


# {% endraw %}
def rendered_answers() -> dict[str, Any]:
    """Return the answers after cookiecutter rendered them."""
    return json.loads(
        r"""
{{ cookiecutter | tojson }}
""".strip()
    )


def raw_answers() -> dict[str, Any]:
    """Return the answers as given, before cookiecutter rendered them as Jinja."""
    return json.loads(
        r"""
{{ _cookiecutter | default({}) | tojson }}
""".strip()
    )


def main() -> int:
    """Validate the rendered answers."""
    return run(rendered_answers(), raw_answers())


if __name__ == "__main__":
    # cookiecutter runs this hook from a copy it renders into the temp folder and keeps there
    if Path(sys.argv[0]).parent.resolve() == Path(tempfile.gettempdir()).resolve():
        Path(sys.argv[0]).unlink(missing_ok=True)  # read already: the hook runs on
    raise SystemExit(main())
