"""The hooks' functions, called directly on the unrendered hook files."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from cookiecutter.generate import generate_context
from cookiecutter.prompt import prompt_for_config

from helpers import HOOK_ANSWERS, TEMPLATE_CONTEXT, TEMPLATE_DIR, TPU_GENERATIONS, VALID_ANSWERS


def rendered_defaults(**overrides: str) -> dict[str, Any]:
    """Render cookiecutter.json's defaults the way cookiecutter does with --no-input."""
    context = generate_context(
        context_file=str(TEMPLATE_DIR / "cookiecutter.json"), extra_context=overrides
    )
    return dict(prompt_for_config(context, no_input=True))


def test_accepts_valid_answers(pre_gen: ModuleType) -> None:
    """It accepts a complete set of valid answers."""
    pre_gen.validate(HOOK_ANSWERS, VALID_ANSWERS)


@pytest.mark.parametrize(
    "accelerator",
    [
        f"{generation}-{size}"
        for generation, entry in TPU_GENERATIONS.items()
        for size in (entry["slice_sizes"][0], entry["slice_sizes"][-1])
    ],
)
def test_accepts_derived_defaults_for_every_generation(
    pre_gen: ModuleType, accelerator: str
) -> None:
    """It accepts the smallest and largest slice of each generation with the derived defaults."""
    answers = rendered_defaults(accelerator_type=accelerator)
    generation = TPU_GENERATIONS[accelerator.split("-")[0]]
    assert answers["zone"] == generation["zones"][0]
    assert answers["runtime_version"] == generation["runtime_versions"][0]
    pre_gen.validate(answers)


@pytest.mark.parametrize(
    ("accelerator", "message"),
    [
        ("v5p-3", "'v5p-3' is not a v5p slice; v5p sizes are 8, 16, 32, 64, 128, 256, 384, ..."),
        ("v4-6", "'v4-6' is not a v4 slice; v4 sizes are 8, 16, 32"),
        ("v4-08", "'v4-08' is not a v4 slice"),
        ("v5litepod-2", "'v5litepod-2' is not a v5litepod slice; v5litepod sizes are 1, 4, 8"),
        ("v5p", "'v5p' is not a v5p slice"),
        ("v9-8", "'v9-8' is not a TPU type the template knows"),
        ("v5e-8", "(v5e is v5litepod)"),
        ("V4-8", "'V4-8' is not a TPU type"),
    ],
)
def test_refuses_slices_the_generation_does_not_offer(
    pre_gen: ModuleType, accelerator: str, message: str
) -> None:
    """It refuses impossible sizes and unknown generations, naming the allowed sizes."""
    with pytest.raises(pre_gen.InvalidAnswer) as raised:
        pre_gen.check_accelerator_type(accelerator, TPU_GENERATIONS)
    assert message in str(raised.value)


def test_reads_the_table_from_the_answers(pre_gen: ModuleType) -> None:
    """It takes slice sizes from the table it is given, not from a copy of its own."""
    shrunk = {**TPU_GENERATIONS, "v5p": {**TPU_GENERATIONS["v5p"], "slice_sizes": [8]}}
    pre_gen.check_accelerator_type("v5p-16", TPU_GENERATIONS)
    with pytest.raises(pre_gen.InvalidAnswer, match="v5p sizes are 8"):
        pre_gen.check_accelerator_type("v5p-16", shrunk)


@pytest.mark.parametrize(
    ("hook_constant", "key"),
    [
        ("PYTHON_VERSIONS", "python_version"),
        ("PRECISIONS", "precision"),
        ("STRATEGIES", "strategy"),
        ("EXAMPLE_TASKS", "example_task"),
    ],
)
def test_choices_match_cookiecutter_json(pre_gen: ModuleType, hook_constant: str, key: str) -> None:
    """It knows exactly the choices cookiecutter.json offers, in the same order."""
    assert list(getattr(pre_gen, hook_constant)) == TEMPLATE_CONTEXT[key]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"project_slug": "My-Model"}, "project_slug 'My-Model' is not a valid slug"),
        ({"project_slug": "my--model"}, "project_slug 'my--model' is not a valid slug"),
        ({"project_slug": "my-model-"}, "project_slug 'my-model-' is not a valid slug"),
        ({"project_slug": "numpy"}, "project_slug 'numpy' clashes with the distribution"),
        ({"package_name": "my-model"}, "package_name 'my-model' is not a valid Python package"),
        ({"package_name": "MyModel"}, "package_name 'MyModel' is not a valid Python package"),
        ({"package_name": "lambda"}, "'lambda' is a Python keyword"),
        ({"package_name": "tests"}, "package_name 'tests' would shadow the 'tests' module"),
        ({"package_name": "yaml"}, "package_name 'yaml' would shadow the 'yaml' module"),
        ({"package_name": "logging"}, "standard-library module 'logging'"),
        ({"project_name": "  "}, "project_name is empty"),
        ({"project_name": "a\nb"}, "contains quotes or shell metacharacters ('\\n')"),
        ({"project_name": "x | y"}, "contains quotes or shell metacharacters ('|')"),
        ({"description": "two\nlines"}, "description 'two\\nlines' contains a line break"),
        ({"description": "{{ x }}"}, "description '{{ x }}' contains template syntax"),
        ({"author_email": "a@b c"}, "author_email 'a@b c' is not an e-mail address"),
        ({"zone": "us-central2-bb"}, "zone 'us-central2-bb' is not a Google Cloud zone"),
        ({"gcp_project": "ends-with-hyphen-"}, "gcp_project 'ends-with-hyphen-' is not"),
        ({"gcp_project": "a" * 31}, "is not a Google Cloud project id"),
        ({"docker_image": ""}, "docker_image '' is not a Docker image name"),
        ({"docker_image": "Registry/Image"}, "docker_image 'Registry/Image' is not a Docker"),
        ({"accelerator_type": "v5p-3"}, "accelerator_type 'v5p-3' is not a v5p slice"),
        (
            {"accelerator_type": "v5p-16", "runtime_version": "v2-alpha-tpuv5-lite"},
            "use v2-alpha-tpuv5",
        ),
        (
            {"accelerator_type": "v6e-16", "runtime_version": "v2-alpha-tpuv5-lite"},
            "'v2-alpha-tpuv5-lite' does not run on v6e-16; use v2-alpha-tpuv6e",
        ),
        (
            {"accelerator_type": "v4-32", "runtime_version": "tpu-vm-base"},
            "'tpu-vm-base' does not run on v4-32; use tpu-ubuntu2204-base or tpu-vm-v4-base",
        ),
        ({"strategy": "zero3"}, "strategy 'zero3' is not supported; choose one of auto"),
    ],
    ids=lambda value: value if isinstance(value, str) else "-".join(map(str, value.values())),
)
def test_rejects_bad_answer_with_message(
    pre_gen: ModuleType, overrides: dict[str, str], message: str
) -> None:
    """It rejects the bad answer with a message naming the value and the fix."""
    with pytest.raises(pre_gen.InvalidAnswer) as raised:
        pre_gen.validate({**HOOK_ANSWERS, **overrides})
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("accelerator", "runtime"),
    [
        ("v4-8", "tpu-vm-v4-pt-2.0"),
        ("v3-32", "tpu-vm-pt-2.0"),
        ("v2-8", "tpu-vm-base"),
        ("v4-32", "tpu-ubuntu2204-base"),
    ],
)
def test_accepts_legacy_runtimes_on_their_generation(
    pre_gen: ModuleType, accelerator: str, runtime: str
) -> None:
    """It accepts the legacy TPU VM images on the generations they boot."""
    pre_gen.check_runtime_version(runtime, accelerator, TPU_GENERATIONS)


def test_rejects_template_syntax_in_the_raw_answer(pre_gen: ModuleType) -> None:
    """It spots Jinja in an answer even after cookiecutter rendered it away."""
    rendered = {**HOOK_ANSWERS, "project_name": "Model 49"}
    raw = {**VALID_ANSWERS, "project_name": "Model {{ 7*7 }}"}
    with pytest.raises(pre_gen.InvalidAnswer, match="contains template syntax"):
        pre_gen.validate(rendered, raw)


def test_run_prints_one_error_line_and_returns_1(
    pre_gen: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """It reports a bad answer as a single ERROR line on stderr and exit code 1."""
    code = pre_gen.run({**HOOK_ANSWERS, "zone": "moon"})
    captured = capsys.readouterr()
    assert code == 1
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "ERROR: zone 'moon' is not a Google Cloud zone; "
        "use the form region-zone, e.g. us-central2-b"
    ]


def test_run_reports_a_missing_answer_as_one_line(
    pre_gen: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """It names a missing answer instead of raising a traceback."""
    answers = {k: v for k, v in HOOK_ANSWERS.items() if k != "zone"}
    assert pre_gen.run(answers) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith("ERROR: answer 'zone' is missing")


def test_run_returns_0_silently_for_valid_answers(
    pre_gen: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """It stays quiet and returns 0 when every answer is valid."""
    assert pre_gen.run(HOOK_ANSWERS) == 0
    assert capsys.readouterr() == ("", "")


LM = ["src/tpu_project/tasks/lm.py", "tests/test_task_lm.py", "configs/lm.toml"]
VISION = ["src/tpu_project/tasks/vision.py", "tests/test_task_vision.py", "configs/vision.toml"]
HF = [
    "src/tpu_project/tasks/hf_causal_lm.py",
    "tests/test_task_hf_causal_lm.py",
    "tests/test_hf_models.py",
    "tests/test_hf_moe.py",
    "tests/test_lora.py",
    "tests/test_hf_export.py",
    "tests/test_pretrained_weights.py",
    "tests/test_pretrained_run.py",
    "tests/test_generation.py",
    "tests/test_benchmarks.py",
    "tests/test_dpo.py",
    "tests/test_grpo.py",
    "benchmarks/dpo_bench.py",
    "src/tpu_project/alignment",
    "tests/hf_helpers.py",
    "configs/hf-causal-lm.toml",
    "benchmarks/load_bench.py",
    "benchmarks/generate_bench.py",
    "docs/hugging-face.md",
    "docs/evaluation.md",
    "docs/alignment.md",
]
CORPUS = [
    "src/tpu_project/tasks/_corpus.py",
    "src/tpu_project/data",
    "src/tpu_project/generation",
    "src/tpu_project/harness",
    "tests/data_helpers.py",
    "tests/test_data_prepare.py",
    "tests/test_data_training.py",
    "tests/test_data_ray.py",
    "configs/ray-cluster.yaml",
    "scripts/ray-node.sh",
    "benchmarks/data_bench.py",
    "benchmarks/read_bench.py",
    "benchmarks/long_bench.py",
    "docs/data.md",
    "docs/long-sequences.md",
]


@pytest.mark.parametrize(
    ("task", "pruned"),
    [("lm", VISION + HF), ("vision", LM + HF + CORPUS), ("hf-causal-lm", LM + VISION)],
)
def test_prunes_the_files_of_the_unchosen_task(
    post_gen: ModuleType, tmp_path: Path, task: str, pruned: list[str]
) -> None:
    """It deletes only the unchosen task's files and folders and tolerates missing ones."""
    present = [
        "src/tpu_project/data/__init__.py",
        "src/tpu_project/tasks/lm.py",
        "src/tpu_project/tasks/vision.py",
        "src/tpu_project/tasks/hf_causal_lm.py",
        "src/tpu_project/tasks/_corpus.py",
        "tests/test_task_lm.py",
        "tests/test_task_vision.py",
        "tests/test_task_hf_causal_lm.py",
    ]  # the configs stay absent on purpose
    for relative in present:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("# placeholder\n")
    answers = {**VALID_ANSWERS, "example_task": task}

    removed = post_gen.prune(tmp_path, answers)

    assert post_gen.paths_to_prune(answers) == pruned
    folders = {str(Path(p).parent) for p in present}
    assert removed == [tmp_path / p for p in pruned if p in present or p in folders]
    remaining = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.py"))
    kept = [p for p in present if p not in pruned and str(Path(p).parent) not in pruned]
    assert remaining == sorted(kept)


def test_makes_shell_scripts_executable(post_gen: ModuleType, tmp_path: Path) -> None:
    """It adds execute bits to scripts/*.sh and leaves other files alone."""
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "startup.sh"
    notes = tmp_path / "scripts" / "notes.txt"
    for path in (script, notes):
        path.write_text("#!/usr/bin/env bash\n")
        path.chmod(0o644)

    post_gen.make_executable(tmp_path)

    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    assert stat.S_IMODE(notes.stat().st_mode) == 0o644


def test_records_only_portable_answers(post_gen: ModuleType, tmp_path: Path) -> None:
    """It drops private keys and absolute paths and writes cookiecutter's replay format."""
    answers: dict[str, Any] = {
        **VALID_ANSWERS,
        "_template": "/home/me/tpu-template",
        "_output_dir": "/tmp/out",
        "_repo_dir": "/home/me/tpu-template",
        "_checkout": None,
        "__prompts__": {"project_name": "Project name"},
        "description": "/an/absolute/path",
    }

    path = post_gen.record_answers(tmp_path, answers)

    recorded = json.loads(path.read_text(encoding="utf-8"))
    expected = {k: v for k, v in VALID_ANSWERS.items() if k != "description"}
    assert path.name == ".cookiecutter.json"
    assert recorded == {"cookiecutter": expected}


def test_records_a_remote_template_location(post_gen: ModuleType) -> None:
    """It keeps the template location when it means the same on every machine."""
    recorded = post_gen.answers_to_record({**VALID_ANSWERS, "_template": "gh:org/tpu-template"})
    assert recorded["_template"] == "gh:org/tpu-template"


@pytest.mark.parametrize("value", ["/abs", "~/x", "C:\\Users\\me", "D:/x", "\\\\server\\share"])
def test_recognises_absolute_paths_on_any_platform(post_gen: ModuleType, value: str) -> None:
    """It treats POSIX, home, drive-letter and UNC paths as absolute."""
    assert post_gen.is_absolute_path(value)


def test_next_steps_name_the_commands_to_run(post_gen: ModuleType) -> None:
    """It tells the user to cd into the project, install, test and train."""
    text = post_gen.next_steps(VALID_ANSWERS)
    for command in ("cd tpu-project", "make install", "make test", "make train-single"):
        assert command in text


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"accelerator_type": "v3-8"}, "backend 'torch_tpu' does not run TPU v3 (v3-8)"),
        ({"python_version": "3.10"}, "backend 'torch_tpu' needs Python 3.11 or newer"),
        ({"strategy": "spmd"}, "strategy 'spmd' is torch_xla's"),
        ({"backend": "jax"}, "backend 'jax' is not supported"),
    ],
    ids=["v3", "python-3.10", "spmd", "unknown"],
)
def test_pre_gen_refuses_what_torch_tpu_cannot_run(
    pre_gen: ModuleType, changes: dict[str, str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """It refuses, in one ERROR line, a generation, Python or strategy torch_tpu lacks."""
    answers = {**HOOK_ANSWERS, "backend": "torch_tpu", **changes}
    if "accelerator_type" in changes:
        answers["runtime_version"] = "tpu-ubuntu2204-base"
    assert pre_gen.run(answers) == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"ERROR: {expected}") and "\n" not in line, line


def test_pre_gen_accepts_both_backends_on_tpu7x(pre_gen: ModuleType) -> None:
    """It accepts TPU7x (Ironwood) with either backend, and v3 with torch_xla."""
    tpu7x = {"accelerator_type": "tpu7x-8", "runtime_version": "v2-alpha-tpu7-ubuntu2404"}
    for backend in ("torch_xla", "torch_tpu"):
        assert pre_gen.run({**HOOK_ANSWERS, **tpu7x, "backend": backend}) == 0
    v3 = {"accelerator_type": "v3-8", "runtime_version": "tpu-ubuntu2204-base"}
    assert pre_gen.run({**HOOK_ANSWERS, **v3, "backend": "torch_xla"}) == 0


def test_post_gen_moves_the_chosen_backend_over_the_default(
    post_gen: ModuleType, tmp_path: Path
) -> None:
    """It replaces the default's modules with the backend's, drops the default-only ones,
    adds the backend's own, and removes every backend folder."""
    package = HOOK_ANSWERS["package_name"]
    core = tmp_path / "src" / package / "core"
    (core / "strategies").mkdir(parents=True)
    (core / "runtime.py").write_text("xla\n")
    (core / "strategies" / "spmd.py").write_text("xla\n")
    theirs = tmp_path / "_backends" / "torch_tpu" / "src" / package / "core"
    theirs.mkdir(parents=True)
    (theirs / "runtime.py").write_text("tpu\n")
    (tmp_path / "_backends" / "torch_tpu" / "tests").mkdir()
    (tmp_path / "_backends" / "torch_tpu" / "tests" / "test_new.py").write_text("new\n")
    moved = post_gen.apply_backend(tmp_path, {**HOOK_ANSWERS, "backend": "torch_tpu"})
    assert (core / "runtime.py").read_text() == "tpu\n"
    assert not (core / "strategies" / "spmd.py").exists()
    assert (tmp_path / "tests" / "test_new.py").read_text() == "new\n"
    assert not (tmp_path / "_backends").exists()
    assert sorted(p.name for p in moved) == ["runtime.py", "test_new.py"]


def test_post_gen_keeps_the_default_backend_untouched(post_gen: ModuleType, tmp_path: Path) -> None:
    """It leaves the default's files as they are and only drops the backend folders."""
    (tmp_path / "core.py").write_text("xla\n")
    (tmp_path / "_backends" / "torch_tpu").mkdir(parents=True)
    (tmp_path / "_backends" / "torch_tpu" / "core.py").write_text("tpu\n")
    assert post_gen.apply_backend(tmp_path, HOOK_ANSWERS) == []
    assert (tmp_path / "core.py").read_text() == "xla\n"
    assert not (tmp_path / "_backends").exists()
