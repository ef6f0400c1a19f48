"""LoRA through peft: the base frozen (and sharded, and bf16 when asked), only the adapters in
the optimizer and the checkpoints, resume exact, bad settings refused in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from {{ cookiecutter.package_name }}.core import make_plan
from {{ cookiecutter.package_name }}.core.checkpoint_files import find_checkpoint
from {{ cookiecutter.package_name }}.core.checkpointing import saved_keys
from {{ cookiecutter.package_name }}.training import build_config, fit
from {{ cookiecutter.package_name }}.training.export import export_checkpoint

from backend_facts import MANY_DEVICES, ONE_GRAPH_PER_STEP_KIND, STEP_COUNTS_ON_DEVICE
from gates import Gate
from hf_helpers import assert_only_adapters_saved
from training_helpers import TINY, cli, preempt_then_resume, write_config

pytestmark = pytest.mark.hf

LORA = {"rank": 4, "alpha": 8}
STEPS = 12
PLAN = make_plan("cpu", 1, "single")
ONE_DEVICE = {"accelerator": "cpu", "devices": "1", "strategy": "single", "precision": "32-true"}


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama pretrained briefly here, exported in the Hugging Face layout: a base."""
    run_dir = tmp_path_factory.mktemp("base")
    config = build_config(
        None, {**TINY, **ONE_DEVICE, "max_steps": 40, "log_every": 40, "run_dir": str(run_dir)}
    )
    summary = fit(config, PLAN)
    out = run_dir / "hf"
    export_checkpoint(str(run_dir / "checkpoints"), out, format="hf")
    (out / "eval.json").write_text(json.dumps(summary["eval"]))  # before any adapter
    return out


def lora_settings(base: Path, run_dir: Path, **overrides: Any) -> dict[str, Any]:
    """LoRA fine-tuning of `base` (the settings as a config file holds them)."""
    options = {"model_name": str(base), "seq_len": 16, "max_bytes": 40_000}
    return {
        **TINY, **ONE_DEVICE, "task_options": options, "lr": 1e-2, "warmup_steps": 2,
        "max_steps": STEPS, "log_every": 1, "run_dir": str(run_dir), "lora": LORA, **overrides,
    }  # fmt: skip


@pytest.fixture(scope="module")
def lora_run(base_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A LoRA run of STEPS steps on one device, checkpointed at its end."""
    run_dir = tmp_path_factory.mktemp("lora")
    summary = fit(build_config(None, lora_settings(base_model, run_dir)), PLAN)
    return {**summary, "run_dir": run_dir}


def test_lora_trains_only_the_adapters(lora_run: dict[str, Any], base_model: Path) -> None:
    """It trains a few percent of the weights, the loss falling, the optimizer over them alone."""
    counts = lora_run["parameters"]
    assert 0 < counts["trainable"] < counts["total"] / 5
    before = json.loads((base_model / "eval.json").read_text())["loss"]
    assert lora_run["eval"]["loss"] < before - 0.005, (lora_run["eval"], before)
    memory = lora_run["memory"]
    # AdamW in fp32: two moments per adapter weight, and a step count per adapter tensor where
    # the backend keeps it on the device.
    counters = memory["optimizer_bytes_total"] - 2 * 4 * counts["trainable"]
    if STEP_COUNTS_ON_DEVICE:
        assert counters % 4 == 0 and 0 < counters // 4 < 64, memory
    else:
        assert counters == 0, memory
    assert lora_run["loop_compilations"] == 1 or not ONE_GRAPH_PER_STEP_KIND


def test_lora_checkpoint_holds_only_the_adapters_and_their_optimizer_state(
    lora_run: dict[str, Any],
) -> None:
    """It saves the adapters and their AdamW moments, not the frozen base."""
    assert_only_adapters_saved(
        saved_keys(find_checkpoint(str(lora_run["run_dir"] / "checkpoints")))
    )


def test_lora_checkpoint_evaluates_with_the_trained_adapters(lora_run: dict[str, Any]) -> None:
    """It evaluates a LoRA checkpoint to the run's own final eval loss."""
    result = cli("eval", "--checkpoint", str(lora_run["run_dir"] / "checkpoints"))
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads(result.stdout.strip().splitlines()[-1])
    assert metrics["loss"] == pytest.approx(lora_run["eval"]["loss"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.interrupts
def test_lora_sigterm_then_resume_matches_the_uninterrupted_run(
    lora_run: dict[str, Any], base_model: Path, gated_src: Path, tmp_path: Path
) -> None:
    """It stops on SIGTERM, and the resumed LoRA run's losses equal the uninterrupted run's."""
    run_dir = tmp_path / "run"
    gate = Gate(tmp_path / "gate", steps=8)  # SIGTERM after step 8
    config = write_config(tmp_path, gate=gate, **lora_settings(base_model, run_dir))
    args = ("train", "--config", str(config), "--run-dir", str(run_dir), "--strategy", "single")
    summary = preempt_then_resume(args, run_dir, gate, gated_src)
    assert summary["train_losses"] == lora_run["train_losses"]


def sharded_fit(base: Path, base_bf16: bool) -> dict[str, Any]:
    """A LoRA fit under fsdp, bf16-mixed (child process)."""
    import tempfile

    from {{ cookiecutter.package_name }}.core import launch
    from {{ cookiecutter.package_name }}.training import plan_of

    with tempfile.TemporaryDirectory() as run_dir:
        settings = lora_settings(
            base, Path(run_dir), devices=str(MANY_DEVICES), strategy="fsdp",
            precision="bf16-mixed", batch_size=16 // MANY_DEVICES, max_steps=4,
            lora={**LORA, "base_bf16": base_bf16},
        )  # fmt: skip
        config = build_config(None, settings)
        plan = plan_of(config)
        return dict(launch(fit, plan, (config, plan)))


@pytest.mark.slow
def test_lora_under_fsdp_shards_the_frozen_base_in_bf16(
    base_model: Path, python_subprocess: Any
) -> None:
    """It shards the frozen base over the devices, in half the bytes with base_bf16."""
    fp32 = python_subprocess([__file__, str(base_model), "0"], env={})
    bf16 = python_subprocess([__file__, str(base_model), "1"], env={})

    for summary in (fp32, bf16):
        assert summary["status"] == "completed"
        assert summary["loop_compilations"] == 1 or not ONE_GRAPH_PER_STEP_KIND
    memory, trainable = fp32["memory"], fp32["parameters"]["trainable"]
    share = memory["param_bytes_total"] / MANY_DEVICES
    assert memory["param_bytes_per_device"] < 1.34 * share  # a share, and the pads
    frozen = fp32["parameters"]["total"] - trainable
    assert bf16["memory"]["param_bytes_total"] == 2 * frozen + 4 * trainable


def test_lora_exports_merged_and_as_an_adapter_that_peft_loads(
    lora_run: dict[str, Any], base_model: Path, tmp_path: Path, python_subprocess: Any
) -> None:
    """It exports the merged model and the adapter alone; peft's base + adapter = merged."""
    checkpoint = str(lora_run["run_dir"] / "checkpoints")
    merged, adapter = tmp_path / "merged", tmp_path / "adapter"
    for out, flags in ((merged, ()), (adapter, ("--adapter-only",))):
        args = ("export", "--checkpoint", checkpoint, "--out", str(out), "--format", "hf")
        result = cli(*args, *flags)
        assert result.returncode == 0, result.stderr[-3000:]
    assert (adapter / "adapter_config.json").is_file() and (adapter / "tokenizer.json").is_file()
    assert not (adapter / "model.safetensors").exists()

    loaded = python_subprocess(
        [__file__, "peft", str(base_model), str(merged), str(adapter)], env={"PJRT_DEVICE": ""}
    )
    assert loaded["adapter_vs_merged"] < 1e-4
    assert loaded["merged_vs_base"] > 1e-3, "the adapters changed nothing"
    assert loaded["torch_xla_loaded"] is False


def compare_with_peft(base: str, merged: str, adapter: str) -> dict[str, Any]:
    """Logits of base, merged export and base + adapter through peft (torch_xla unimportable)."""
    sys.modules["torch_xla"] = None  # type: ignore[assignment]
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokens = AutoTokenizer.from_pretrained(merged)(
        "def main(argv):\n    return", return_tensors="pt"
    )
    logits = {}
    with torch.no_grad():
        for name, folder in (("base", base), ("merged", merged)):
            model = AutoModelForCausalLM.from_pretrained(folder).eval()
            logits[name] = model(**tokens).logits
        with_adapter = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(base), adapter
        )
        logits["adapter"] = with_adapter.eval()(**tokens).logits
    return {
        "adapter_vs_merged": float((logits["adapter"] - logits["merged"]).abs().max()),
        "merged_vs_base": float((logits["merged"] - logits["base"]).abs().max()),
        "torch_xla_loaded": sys.modules.get("torch_xla") is not None,
    }


BAD = {
    "targets matching nothing": (
        ["--set", "lora.target_modules=no_such_proj"],
        "error: lora.target_modules ('no_such_proj',) match nothing",
    ),
    "unknown option": (["--set", "lora.rnak=4"], "error: unknown lora option 'rnak'"),
    "bf16 base without autocast": (
        ["--set", "lora.base_bf16=true", "--precision", "32-true"],
        "error: lora.base_bf16 needs precision 'bf16-mixed'",
    ),
}


@pytest.mark.parametrize("args,start", BAD.values(), ids=BAD)
def test_bad_lora_settings_fail_in_one_line(
    args: list[str], start: str, base_model: Path, tmp_path: Path
) -> None:
    """It refuses LoRA settings it cannot use with one line and exit 2, before training."""
    config = write_config(tmp_path, **lora_settings(base_model, tmp_path / "run", max_steps=2))
    result = cli("train", "--config", str(config), "--run-dir", str(tmp_path / "run"), *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), lines
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_peft_wrapping_silences_the_deprecation_only_transformers_prints() -> None:
    """It drops transformers 5.23's FutureWarning on `is_gradient_checkpointing`, which peft
    reads as it wraps a model, and lets every other warning through."""
    import warnings

    from {{ cookiecutter.package_name }}.hf.lora import quiet_peft_wrapping

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_peft_wrapping():
            warnings.warn(
                "`is_gradient_checkpointing` is deprecated and will be removed in v6. Use "
                "`is_activation_checkpointing` instead.",
                FutureWarning,
                stacklevel=1,
            )
            warnings.warn("something else is deprecated", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["something else is deprecated"]


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    if sys.argv[1] == "peft":
        print(json.dumps(compare_with_peft(*sys.argv[2:5])))
    else:
        print(json.dumps(sharded_fit(Path(sys.argv[1]), bool(int(sys.argv[2])))))
