"""The torch_tpu bake of the hf-causal-lm example's `make install && make test`, run the way
its README tells a user: in the bake's own `.venv`, from a shell where no environment is
activated (a file of its own, so the two test workers run it beside the other suites)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from helpers import Baked, pytest_summary
from users_shell import install_the_users_way, run

# What the torch_tpu bake of the hf-causal-lm example runs of its suite: the quick tier of the
# tests its task changes and its docs held against its code (which `make test` also runs, in
# the template's environment: test_baked_suites.py), and its every-layout runs whole (a tiny
# Llama, LoRA under FSDP2, a saved one read by shards).
# The rest is the shared code's suite, which the torch_tpu lm bake runs whole
# (test_torch_tpu_bake_installs_and_passes_its_suite_from_a_plain_shell); the slow tier of the
# Hugging Face tests trains each decoder and mixture under fsdp, for minutes each.
TORCH_TPU_HF_QUICK = (
    "-m 'not slow' tests/test_task_hf_causal_lm.py tests/test_hf_models.py tests/test_hf_moe.py "
    "tests/test_lora.py tests/test_hf_export.py tests/test_docs_match_code.py "
    "tests/test_generation.py tests/test_benchmarks.py tests/test_dpo.py tests/test_grpo.py"
)


@pytest.mark.full
def test_torch_tpu_hf_bake_installs_and_passes_its_suite_from_a_plain_shell(
    bake_combo: Callable[[str], Baked], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """It passes the torch_tpu bake of the hf-causal-lm example the same way: the quick tier of
    the tests its task changes (transformers decoders and mixtures, LoRA, the Hugging Face
    export), and a tiny Llama in every layout with LoRA in bf16-mixed on one process and
    under FSDP2, and read by shards from its saved safetensors."""
    installed = install_the_users_way(
        bake_combo, "torch-tpu-hf-causal-lm-fsdp", tmp_path_factory.mktemp("torch-tpu-hf")
    )
    quick = f"PYTEST_ARGS=-q -p no:cacheprovider -rfE {TORCH_TPU_HF_QUICK}"
    output = run(["make", "test", quick], installed.project, installed.env, 2400)
    counts = pytest_summary(output)
    assert counts.get("passed", 0) > 0 and not counts.get("failed"), output[-3000:]
    assert not counts.get("error"), output[-3000:]
    # The passed tests by name, then failures.
    files = "tests/test_distributed.py tests/test_pretrained_run.py"
    layouts = f"PYTEST_ARGS=-q -p no:cacheprovider -rpfE {files}"
    output = run(["make", "test", layouts], installed.project, installed.env, 2400)
    counts = pytest_summary(output)
    assert counts.get("passed", 0) > 0 and not counts.get("failed"), output[-3000:]
    assert not counts.get("deselected") and not counts.get("error"), output[-3000:]
    for test in (
        "test_every_layout_trains_the_one_process_losses",
        "test_lora_in_bf16_trains_only_the_adapters_alike_on_one_process_and_fsdp",
        "test_lora_checkpoint_holds_only_the_adapters_and_their_optimizer_state",
    ):
        assert f"PASSED tests/test_distributed.py::{test}" in output, output[-3000:]
    # A saved bf16 Llama read by shards fine-tunes to the losses of the one loaded whole.
    read = "PASSED tests/test_pretrained_run.py::test_read_by_shards_trains_as_loaded_whole"
    for layout in ("one device full", "fsdp x4 full", "fsdp x tensor 2x2 full",
                   "fsdp x tensor 2x2 lora"):  # fmt: skip
        assert f"{read}[{layout}]" in output, output[-3000:]
