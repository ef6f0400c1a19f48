"""DPO as TRL defines it: 10 steps of each loss give TRL's DPOTrainer's losses and metrics
(the same model, pairs, beta and SGD), with and without LoRA, on one device and on the mesh;
preference data that cannot be read as pairs is refused in one line."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from backend_facts import MANY_DEVICES, SHARDED
from hf_helpers import save_tiny_pretrained
from training_helpers import cli, cli_json

pytestmark = pytest.mark.hf

STEPS, PAIRS, MAX_LENGTH = 10, 64, 40
# IPO's squared loss has gradients ten times the others' at beta 0.1: at their rate its
# steps overshoot and the run amplifies float rounding, so it takes a tenth of it.
RATES = {"ipo": 0.005}
METRICS = ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
           "logps/chosen", "logps/rejected")  # fmt: skip
WORDS = ["red", "blue", "green", "cat", "dog", "tree", "house", "river", "sun", "moon"]


def write_pairs(path: Path, count: int = PAIRS, seed: int = 3) -> Path:
    """`count` pairs in TRL's plain-text format: a question, a right and a wrong answer."""
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        right, wrong = rng.sample(WORDS, 2)
        prompt = f"Q{index}: which word is {right}?"
        rows.append({"prompt": prompt, "chosen": f" {right} it is", "rejected": f" {wrong}, no"})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("dpo")
    return {"base": base, "model": save_tiny_pretrained(base / "model"),
            "pairs": write_pairs(base / "pairs.jsonl")}  # fmt: skip


def options(setup: dict[str, Path], loss_type: str, lora: bool) -> list[str]:
    sets = {
        "task": "hf-causal-lm", "task_options.model_name": str(setup["model"]),
        "objective": "dpo", "dpo.data": str(setup["pairs"]),
        "dpo.loss_type": loss_type, "dpo.beta": 0.1, "dpo.max_length": MAX_LENGTH,
        "dpo.eval_fraction": 0.0, "optimizer": "sgd", "weight_decay": 0.0, "warmup_steps": 0,
        "schedule": "constant", "grad_clip": 0.0, "precision": "32-true",
    }  # fmt: skip
    if loss_type == "robust":
        sets["dpo.label_smoothing"] = 0.1
    if lora:
        targets = '["q_proj", "v_proj"]'
        sets.update({"lora.rank": 4, "lora.alpha": 8, "lora.target_modules": targets})
    return [word for key, value in sets.items() for word in ("--set", f"{key}={value}")]


def ours(
    setup: dict[str, Path], name: str, loss_type: str, lora: bool, devices: int = 1
) -> list[dict[str, float]]:
    """The project's run: each step's loss and TRL-named metrics."""
    run_dir = setup["base"] / name
    layout = ["--devices", str(devices), "--strategy", SHARDED] if devices > 1 else []
    done = cli(
        "train", *options(setup, loss_type, lora), "--max-steps", str(STEPS),
        "--lr", str(RATES.get(loss_type, 0.05)), "--batch-size", str(PAIRS // devices),
        "--log-every", "1", "--eval-every", "0", "--run-dir", str(run_dir),
        "--accelerator", "cpu", *layout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    steps: list[dict[str, float]] = [{} for _ in range(STEPS)]
    for metric in METRICS:
        for event in events.Scalars(f"train/{metric}"):
            steps[event.step - 1][metric] = event.value
    return steps


def reference_run(setup: dict[str, Path], loss_type: str, lora: bool) -> list[dict[str, float]]:
    """TRL's DPOTrainer on the CPU (its own process: no XLA), from the same initial weights."""
    out = setup["base"] / f"trl-{loss_type}-{lora}.json"
    request = {
        "model": str(setup["model"]), "pairs": str(setup["pairs"]), "loss_type": loss_type,
        "out": str(out), "options": options(setup, loss_type, lora),
    }  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PJRT_", "XLA_"))}
    env.update(USE_TORCH_XLA="0", PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, __file__, json.dumps(request)], env=env, capture_output=True,
        text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return list(json.loads(out.read_text()))


def trl_train(request: dict[str, Any]) -> None:
    """In the TRL process: the project's model as its run builds it (the same LoRA init), then
    DPOTrainer for STEPS steps of the whole batch; each step's logged metrics."""
    import datasets
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    from {{ cookiecutter.package_name }}.core.materialize import fill_whole
    from {{ cookiecutter.package_name }}.tasks import load_task
    from {{ cookiecutter.package_name }}.training import build_config
    from {{ cookiecutter.package_name }}.training.config import parse_override
    from {{ cookiecutter.package_name }}.training.model import build

    words = request["options"]
    overrides = dict(parse_override(words[i + 1]) for i in range(0, len(words), 2))
    config = build_config(None, overrides)
    task = load_task(config.task, config.data, config.task_options)
    built = build(task, config)
    model = built.model
    fill_whole(model, built.source, "cpu")
    tokenizer = AutoTokenizer.from_pretrained(request["model"])
    args = DPOConfig(
        output_dir=str(Path(request["out"]).parent / "trl"), beta=0.1,
        loss_type=[request["loss_type"]],
        label_smoothing=0.1 if request["loss_type"] == "robust" else 0.0,
        max_length=MAX_LENGTH, per_device_train_batch_size=PAIRS, max_steps=STEPS,
        learning_rate=RATES.get(request["loss_type"], 0.05), optim="sgd",
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=0.0,
        logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, seed=0,
        disable_tqdm=True, bf16=False,  # TRL defaults to bf16
    )  # fmt: skip
    pairs = datasets.load_dataset("json", data_files=request["pairs"], split="train")
    trainer = DPOTrainer(
        model=model, ref_model=None, args=args, train_dataset=pairs, processing_class=tokenizer
    )
    trainer.train()
    logged = [
        {name: float(entry[name]) for name in METRICS}
        for entry in trainer.state.log_history
        if "rewards/chosen" in entry
    ]
    Path(request["out"]).write_text(json.dumps(logged))


def assert_like(mine: list[dict[str, float]], theirs: list[dict[str, float]]) -> None:
    assert len(mine) == len(theirs) == STEPS
    for step, (a, b) in enumerate(zip(mine, theirs, strict=True), 1):
        for name in METRICS:
            # 1e-5 absolute, or relative where the value is above 1 (IPO's loss starts at 25)
            close = pytest.approx(b[name], rel=1e-5, abs=1e-5)
            assert a[name] == close, (step, name, a[name], b[name])
    assert mine[-1]["loss"] != pytest.approx(mine[0]["loss"], abs=1e-4)  # it learned


# `make test` runs each loss once and sigmoid both ways; `make test-full` every pair.
SLOW = {("ipo", False), ("hinge", True), ("robust", False), ("robust", True)}
CASES = [
    pytest.param(loss, lora, id=f"{loss}-{'lora' if lora else 'full'}",
                 marks=[pytest.mark.slow] if (loss, lora) in SLOW else [])
    for loss in ("sigmoid", "ipo", "hinge", "robust") for lora in (False, True)
]  # fmt: skip


@pytest.mark.parametrize(("loss_type", "lora"), CASES)
def test_dpo_steps_give_trls_losses_and_metrics(
    setup: dict[str, Path], loss_type: str, lora: bool
) -> None:
    """It gives, step by step for 10 steps, TRL's DPOTrainer's loss and every metric it logs
    (within 1e-5), with a frozen reference copy, or under LoRA its adapters turned off."""
    mine = ours(setup, f"{loss_type}-{lora}", loss_type, lora)
    assert_like(mine, reference_run(setup, loss_type, lora))


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_dpo_on_the_mesh_gives_the_one_device_steps(setup: dict[str, Path], lora: bool) -> None:
    """It gives the one device's DPO steps with the model and its reference sharded."""
    single = ours(setup, f"single-{lora}", "sigmoid", lora)
    mesh = ours(setup, f"mesh-{lora}", "sigmoid", lora, devices=MANY_DEVICES)
    for a, b in zip(single, mesh, strict=True):
        for name in METRICS:
            assert a[name] == pytest.approx(b[name], rel=1e-5, abs=1e-5), name
{%- if cookiecutter.backend == "torch_tpu" %}


# A v5e slice of 4 devices, as 4 CPU processes.
SLICE, SLICE_DEVICES = "v5e-4", 4
{%- else %}


# The project's slice of 8 devices, on 8 XLA:CPU devices.
SLICE, SLICE_DEVICES = "v5e-8", 8
{%- endif %}


def planned_and_measured(
    setup: dict[str, Path], name: str, lora: bool, devices: int, accelerator: str
) -> tuple[dict[str, int], dict[str, int]]:
    """`plan`'s bytes per device for a DPO run, and what the run (2 steps) holds."""
    run_dir = setup["base"] / name
    layout = ["--devices", str(devices), "--strategy", SHARDED] if devices > 1 else []
    done = cli(
        "train", *options(setup, "sigmoid", lora), "--max-steps", "2", "--batch-size", "2",
        "--eval-every", "0", "--run-dir", str(run_dir), "--accelerator", "cpu", *layout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    measured = json.loads((run_dir / "summary.json").read_text())["memory"]
    mesh = ["--mesh", f"fsdp={devices}"]
    planned = json.loads(
        cli_json("plan", *options(setup, "sigmoid", lora), *mesh, accelerator_type=accelerator)
    )["per_device"]
    return planned, measured


def assert_one_copy_under_lora(setup: dict[str, Path], devices: int, accelerator: str) -> None:
    full = planned_and_measured(setup, f"held-full-{devices}", False, devices, accelerator)
    lora = planned_and_measured(setup, f"held-lora-{devices}", True, devices, accelerator)
    for planned, measured in (full, lora):
        assert planned["param_bytes"] == measured["param_bytes_per_device"]
        assert planned["reference_bytes"] == measured["reference_bytes_per_device"]
    # A full fine-tune holds its frozen copy: the same bytes as the policy, laid out as it is.
    assert full[0]["reference_bytes"] == full[0]["param_bytes"] > 0
    assert full[0]["total_bytes"] - lora[0]["total_bytes"] >= full[0]["reference_bytes"]
    # Under LoRA the reference is the policy with its adapters off: no second copy.
    assert lora[0]["reference_bytes"] == 0
    adapters = lora[0]["param_bytes"] - full[0]["param_bytes"]
    assert 0 < adapters < full[0]["param_bytes"] // 10


def test_plan_counts_the_frozen_reference_a_run_holds_and_none_under_lora(
    setup: dict[str, Path],
) -> None:
    """It plans, on one device, the bytes a DPO run holds: the frozen reference copy of a full
    fine-tune; under LoRA one copy of the base, and its adapters."""
    assert_one_copy_under_lora(setup, 1, "v5e-1")


@pytest.mark.slow
def test_plan_counts_the_frozen_reference_on_the_slice(setup: dict[str, Path]) -> None:
    """It plans the same on the slice's devices, the model and its reference sharded."""
    assert_one_copy_under_lora(setup, SLICE_DEVICES, SLICE)


REFUSED = {
    "no-rejected-column": ('{"prompt": "a", "chosen": "b"}\n', "has no 'rejected' column"),
    "not-json": ("{prompt\n", "cannot read preference pairs"),
}


@pytest.mark.parametrize(("text", "message"), REFUSED.values(), ids=REFUSED)
def test_preference_data_that_is_not_pairs_is_refused_in_one_line(
    setup: dict[str, Path], text: str, message: str
) -> None:
    """It refuses, in one line before training and writing nothing, data that is not pairs."""
    pairs = setup["base"] / "bad.jsonl"
    pairs.write_text(text)
    run_dir = setup["base"] / "refused"
    done = cli(
        "train", *options({**setup, "pairs": pairs}, "sigmoid", False), "--max-steps", "1",
        "--run-dir", str(run_dir), "--accelerator", "cpu",
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert not (run_dir / "checkpoints").exists()


def test_pairs_whose_chosen_is_their_rejected_are_warned_about_once(tmp_path: Path) -> None:
    """It warns once, naming the count, when chosen equals rejected in some pairs."""
    from transformers import AutoTokenizer

    from {{ cookiecutter.package_name }}.alignment.preferences import Pairs

    folder = save_tiny_pretrained(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    same = [{"prompt": "p", "chosen": " a", "rejected": " a"}] * 3
    with pytest.warns(UserWarning, match="3 pair") as caught:
        Pairs([*same, {"prompt": "p", "chosen": " a", "rejected": " b"}], tokenizer, 16, "t")
    assert len([w for w in caught if "chosen equal to rejected" in str(w.message)]) == 1


def test_a_long_pair_keeps_its_prompt_and_the_start_of_its_completion(tmp_path: Path) -> None:
    """It keeps a long pair's start (TRL's keep_start): the whole prompt, then the completion
    cut at max_length; a prompt that fills max_length drops the pair."""
    from transformers import AutoTokenizer

    from {{ cookiecutter.package_name }}.alignment.preferences import Pairs, tokenize_pair

    folder = save_tiny_pretrained(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    long = {"prompt": "short prompt", "chosen": " word" * 40, "rejected": " other" * 40}
    pair = tokenize_pair(tokenizer, long)
    (record,) = Pairs([long], tokenizer, 16, "t").records
    for row, completion in enumerate((pair.chosen, pair.rejected)):
        assert record["ids"][row].tolist() == (pair.prompt + completion)[:16]
        kept = 16 - len(pair.prompt)
        assert record["mask"][row].tolist() == [0] * len(pair.prompt) + [1] * kept
    overfull = {"prompt": "word " * 40, "chosen": " a", "rejected": " b"}
    with pytest.warns(UserWarning, match="1 pair"):
        kept = Pairs([long, overfull], tokenizer, 16, "t")
    assert len(kept) == 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    trl_train(json.loads(sys.argv[1]))
