"""A baked project's own test suite passes, in this interpreter's environment."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest

from helpers import Baked, project_env, pytest_summary, run

# What the bakes beside the default one (which runs the user's way, test_users_way.py) run
# of their suites. `make test`: the hf-causal-lm bake's quick tier of the tests its task
# changes (its Llama's bytes per device among them) and of its docs; the docs tests alone of
# the vision bake and of the torch_tpu hf bake (each bake's docs held against its own code:
# seconds). The torch_tpu hf bake's run is in this environment (torch 2.9, transformers,
# peft): the torch_tpu lm bake's own venv lacks transformers and peft, which its checks need
# (the Hugging Face model's parameter names, its task options), and installing the hf bake
# the user's way takes minutes (test_users_way_torch_tpu_hf.py, `make test-full`, runs its
# docs tests there too). `make test-full`: their slow tier (each decoder and mixture trained
# under fsdp, a pretrained model read by shards fine-tuned on every layout) and the shared
# tests with a model's own tokenizer; the vision bake's quick tier of the tests its task
# changes; the ddp/bf16-true bake's tests that read its baked strategy, precision and
# accelerator type.
HF_FILES = (
    "tests/test_hf_models.py tests/test_hf_moe.py tests/test_lora.py tests/test_hf_export.py "
    "tests/test_pretrained_weights.py tests/test_pretrained_run.py tests/test_task_hf_causal_lm.py "
    "tests/test_generation.py tests/test_benchmarks.py tests/test_dpo.py tests/test_grpo.py"
)
HF_SHARED = (
    "tests/test_data_prepare.py tests/test_data_training.py tests/test_trainer.py "
    "tests/test_fsdp.py tests/test_precision.py tests/test_makefile.py"
)
# The docs tests: links and anchors, the README's inventory of commands, and every flag,
# config key, make target, path and sharding rule the pages name, held against the code.
DOCS_FILES = (
    "tests/test_doc_links.py tests/test_docs_match_code.py "
    "tests/test_readme.py::test_every_documented_command_is_in_the_inventory "
    "tests/test_readme.py::test_inventory_names_tests_that_exist"
)
HF = "hf-causal-lm-fsdp-bf16-mixed"
SUITE_COMBOS = {
    HF: (
        HF,
        f"-m 'not slow' {HF_FILES} tests/test_cli.py tests/test_xla_memory.py "
        "tests/test_readme.py tests/test_doc_links.py tests/test_docs_match_code.py",
    ),
    "vision-bf16-mixed-spmd-docs": ("vision-bf16-mixed-spmd", DOCS_FILES),
    "torch-tpu-hf-causal-lm-fsdp-docs": ("torch-tpu-hf-causal-lm-fsdp", DOCS_FILES),
}
FULL_COMBOS = {
    f"{HF}-slow": (HF, f"-m slow {HF_FILES}"),
    f"{HF}-shared": (HF, HF_SHARED),
    "vision-bf16-mixed-spmd": (
        "vision-bf16-mixed-spmd",
        "-m 'not slow' tests/test_task_vision.py tests/test_trainer.py tests/test_strategy.py "
        "tests/test_precision.py tests/test_evaluation.py tests/test_cli.py "
        "tests/test_makefile.py tests/test_readme.py tests/test_doc_links.py",
    ),
    "v4-8-ddp-bf16-true": (
        "v4-8-ddp-bf16-true",
        "-m 'not slow' tests/test_pod.py tests/test_runtime.py tests/test_strategy.py "
        "tests/test_precision.py tests/test_dockerfile.py tests/test_startup_script.py "
        "tests/test_scan.py",
    ),
}
SUITE_RUNS = [pytest.param(*SUITE_COMBOS[i], marks=pytest.mark.suite, id=i) for i in SUITE_COMBOS]
FULL_RUNS = [pytest.param(*FULL_COMBOS[i], marks=pytest.mark.full, id=i) for i in FULL_COMBOS]


@pytest.mark.parametrize(("combo", "selection"), [*SUITE_RUNS, *FULL_RUNS])
def test_baked_project_test_suite_passes(
    combo: str, selection: str, bake_combo: Callable[[str], Baked]
) -> None:
    """It passes the named part of a baked project's own suite in this environment, on the CPU."""
    baked = bake_combo(combo)
    assert baked.exit_code == 0, baked.exception
    # The project's own `make test`, pointed at this interpreter's environment.
    result = run(
        [
            "make",
            "test",
            f"VENV={sys.prefix}",
            f"PYTEST_ARGS=-q -x -p no:cacheprovider {selection}",
        ],
        project_env(baked),
        cwd=baked.path,
        timeout=2400,
    )
    output = result.stdout + result.stderr
    summary = pytest_summary(result.stdout)
    assert result.returncode == 0, output[-5000:]
    assert summary.get("passed", 0) > 0, output[-3000:]
    problems = {word: n for word, n in summary.items() if word.startswith(("failed", "error"))}
    assert not problems, output[-5000:]
