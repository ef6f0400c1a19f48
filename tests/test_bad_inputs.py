"""Bad answers stop the bake with one clear line and leave nothing behind."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from helpers import VALID_ANSWERS


class BadInput(NamedTuple):
    id: str
    context: dict[str, str]
    message: str


# Passed to the real CLI as key=value pairs, as a user would type them.
BAD_INPUTS = [
    BadInput(
        "name-starts-with-digit",
        {"project_name": "1abc"},
        "project_slug '1abc' is not a valid slug",
    ),
    BadInput(
        "explicit-slug-with-bang",
        {"project_slug": "my-project!"},
        "project_slug 'my-project!' is not a valid slug",
    ),
    BadInput("package-is-keyword", {"package_name": "class"}, "'class' is a Python keyword"),
    BadInput(
        "name-shadows-torch",
        {"project_name": "torch"},
        "package_name 'torch' would shadow the 'torch' module",
    ),
    BadInput(
        "package-shadows-torch-xla",
        {"package_name": "torch_xla"},
        "package_name 'torch_xla' would shadow the 'torch_xla' module",
    ),
    BadInput(
        "name-shadows-stdlib-test",
        {"project_name": "test"},
        "package_name 'test' would shadow the 'test' module",
    ),
    BadInput(
        "package-shadows-stdlib-json",
        {"package_name": "json"},
        "would shadow the standard-library module 'json'",
    ),
    BadInput("package-shadows-typer", {"package_name": "typer"}, "would shadow the 'typer' module"),
    BadInput(
        "name-with-quotes-and-semicolons",
        {"project_name": 'a"; rm -rf ~; "b'},
        "contains quotes or shell metacharacters ('\"', ';')",
    ),
    BadInput(
        "name-with-command-substitution",
        {"project_name": "$(touch pwned)"},
        "contains quotes or shell metacharacters ('$')",
    ),
    BadInput(
        "name-with-backticks",
        {"project_name": "`touch pwned`"},
        "contains quotes or shell metacharacters ('`')",
    ),
    BadInput(
        "name-with-jinja-expression",
        {"project_name": "{{ 7*7 }}"},
        "project_name '{{ 7*7 }}' contains template syntax",
    ),
    BadInput(
        "name-with-jinja-statement",
        {"project_name": "x{% if true %}y{% endif %}"},
        "contains template syntax",
    ),
    BadInput(
        "explicit-slug-with-accents",
        {"project_slug": "résumé"},
        "project_slug 'résumé' is not a valid slug",
    ),
    BadInput(
        "v5p-size-not-offered",
        {"accelerator_type": "v5p-3"},
        "accelerator_type 'v5p-3' is not a v5p slice; v5p sizes are 8, 16, 32",
    ),
    BadInput(
        "v4-size-not-offered",
        {"accelerator_type": "v4-6"},
        "accelerator_type 'v4-6' is not a v4 slice; v4 sizes are 8, 16, 32",
    ),
    BadInput(
        "unknown-generation",
        {"accelerator_type": "v9-8"},
        "accelerator_type 'v9-8' is not a TPU type the template knows",
    ),
    BadInput(
        "v5e-by-its-marketing-name",
        {"accelerator_type": "v5e-8"},
        "(v5e is v5litepod)",
    ),
    BadInput("zone-without-hyphens", {"zone": "uscentral2b"}, "zone 'uscentral2b' is not a"),
    BadInput("zone-is-a-region", {"zone": "us-central2"}, "zone 'us-central2' is not a"),
    BadInput(
        "unknown-runtime",
        {"runtime_version": "tpu-vm-tf-2.16.1"},
        "runtime_version 'tpu-vm-tf-2.16.1' is unknown",
    ),
    BadInput(
        "v5e-with-ubuntu-runtime",
        {"accelerator_type": "v5litepod-8", "runtime_version": "tpu-ubuntu2204-base"},
        "'tpu-ubuntu2204-base' does not run on v5litepod-8; use v2-alpha-tpuv5-lite",
    ),
    BadInput(
        "v4-with-v6e-runtime",
        {"accelerator_type": "v4-8", "runtime_version": "v2-alpha-tpuv6e"},
        "'v2-alpha-tpuv6e' does not run on v4-8",
    ),
    BadInput(
        "v3-with-v4-only-runtime",
        {"accelerator_type": "v3-8", "runtime_version": "tpu-vm-v4-base"},
        "'tpu-vm-v4-base' does not run on v3-8",
    ),
    BadInput(
        "gcp-project-uppercase",
        {"gcp_project": "My_Project"},
        "gcp_project 'My_Project' is not a Google Cloud project id",
    ),
    BadInput("gcp-project-too-short", {"gcp_project": "abc"}, "gcp_project 'abc' is not a"),
    BadInput("email-without-at", {"author_email": "nobody"}, "author_email 'nobody' is not an"),
    BadInput(
        "docker-image-with-space",
        {"docker_image": "my image"},
        "docker_image 'my image' is not a Docker image name",
    ),
]

# Values cookiecutter's own choice check would reject on the command line can
# still arrive through a hand-edited answers file passed to --replay-file.
BAD_REPLAYS = [
    BadInput(
        "unknown-accelerator",
        {"accelerator_type": "v9-8"},
        "accelerator_type 'v9-8' is not a TPU type the template knows",
    ),
    BadInput("unsupported-python", {"python_version": "3.8"}, "python_version '3.8' is not"),
    BadInput("unknown-precision", {"precision": "fp16"}, "precision 'fp16' is not supported"),
    BadInput("unknown-task", {"example_task": "rl"}, "example_task 'rl' is not supported"),
]


def assert_refused(result: subprocess.CompletedProcess[str], out: Path, message: str) -> None:
    """Assert a failed bake: our ERROR line first, naming the problem, and no output."""
    assert result.returncode != 0
    first_line = result.stderr.lstrip().splitlines()[0] if result.stderr.strip() else ""
    assert first_line.startswith("ERROR: "), result.stderr
    assert message in first_line, first_line
    assert list(out.iterdir()) == [], "the failed bake left files behind"


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[case.id for case in BAD_INPUTS])
def test_cli_refuses_bad_input_with_one_error_line(
    case: BadInput,
    tmp_path: Path,
    run_cookiecutter: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """It refuses the answer with a first stderr line saying what is wrong and what to do,
    and leaves nothing in the temp folder either."""
    out, temp = tmp_path / "out", tmp_path / "temp"
    out.mkdir()
    temp.mkdir()
    result = run_cookiecutter(out, context=case.context, cwd=tmp_path, temp_dir=temp)
    assert_refused(result, out, case.message)
    assert list(temp.iterdir()) == []
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("case", BAD_REPLAYS, ids=[case.id for case in BAD_REPLAYS])
def test_replay_refuses_bad_answer_file(
    case: BadInput,
    tmp_path: Path,
    run_cookiecutter: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """It refuses a hand-edited answers file with the same single ERROR line."""
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"cookiecutter": {**VALID_ANSWERS, **case.context}}))
    out = tmp_path / "out"
    out.mkdir()
    result = run_cookiecutter(out, "--replay-file", str(answers), cwd=tmp_path, no_input=False)
    assert_refused(result, out, case.message)
