"""GRPO as TRL defines it: on fixed rollouts and rewards, the loss, every gradient and the
logged metrics equal TRL's GRPOTrainer's for `grpo`, `dapo` and `dr_grpo` (and with the KL
term); on a task the test writes (add two digits), a tiny model's mean reward rises over 30
steps with a fixed set of compiled graphs; what GRPO cannot run is refused in one line."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from backend_facts import MANY_DEVICES, SHARDED
from hf_helpers import save_tiny_pretrained

pytestmark = pytest.mark.hf

GROUP, PROMPTS, MAX_COMPLETION = 4, 4, 8
TEMPERATURE = 0.9
REWARDS_FILE = """
import json
from pathlib import Path

TABLE = json.loads(Path(__file__).with_name("rewards.json").read_text())


def fixed(completions, completion_ids, **kwargs):
    return TABLE["fixed"]


def short(completions, completion_ids, **kwargs):
    return [None if len(ids) % 3 == 0 else -0.1 * len(ids) for ids in completion_ids]


def broken(completions, **kwargs):
    raise RuntimeError("no answer key")
"""
METRICS = ("entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
           "reward", "reward_std", "frac_reward_zero_std", "rewards/fixed/mean",
           "rewards/fixed/std", "rewards/short/mean", "rewards/short/std")  # fmt: skip


def write_rollouts(base: Path, vocab: int, eos: int, seed: int = 5) -> dict[str, Any]:
    """Prompts of 3 to 8 tokens, GROUP completions of each (1 to MAX_COMPLETION tokens, some
    ending in the end-of-sequence id), and rewards: one group's all equal (zero std)."""
    rng = random.Random(seed)
    ordinary = [i for i in range(vocab) if i != eos]
    prompts = [rng.sample(ordinary, rng.randint(3, 8)) for _ in range(PROMPTS)]
    completions, fixed = [], []
    for index in range(PROMPTS * GROUP):
        tokens = rng.choices(ordinary, k=rng.randint(1, MAX_COMPLETION))
        if index % 3 == 0 and len(tokens) < MAX_COMPLETION:
            tokens.append(eos)
        completions.append(tokens)
        fixed.append(0.5 if index // GROUP == 1 else float(rng.randint(0, 4)))
    (base / "rewards.json").write_text(json.dumps({"fixed": fixed}))
    (base / "rewards_fixed.py").write_text(REWARDS_FILE)
    (base / "prompts.jsonl").write_text(
        "".join(json.dumps({"prompt": f"prompt {i}"}) + "\n" for i in range(PROMPTS))
    )
    return {"prompts": prompts, "completions": completions}


def perturbed_policy(model_dir: Path, out: Path) -> Path:
    """The tiny model moved a little off its initial weights: the reference's KL is not 0."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.02 * torch.randn(param.shape, generator=generator))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from transformers import AutoTokenizer

    base = tmp_path_factory.mktemp("grpo")
    model = save_tiny_pretrained(base / "model")
    tokenizer = AutoTokenizer.from_pretrained(model)
    rollouts = write_rollouts(base, len(tokenizer), tokenizer.eos_token_id)
    return {"base": base, "model": model, "policy": perturbed_policy(model, base / "policy"),
            **rollouts}  # fmt: skip


def grpo_table(setup: dict[str, Any], loss_type: str, beta: float) -> dict[str, Any]:
    rewards = setup["base"] / "rewards_fixed.py"
    return {
        "prompts": str(setup["base"] / "prompts.jsonl"),
        "reward_funcs": [f"{rewards}:fixed", f"{rewards}:short"],
        "reward_weights": [1.0, 0.5], "num_generations": GROUP, "max_prompt_length": 8,
        "max_completion_length": MAX_COMPLETION, "loss_type": loss_type, "beta": beta,
        "temperature": TEMPERATURE, "eval_fraction": 0.0,
    }  # fmt: skip


def run_side(setup: dict[str, Any], side: str, loss_type: str, beta: float) -> dict[str, Any]:
    """One side's loss, gradients and metrics on the fixed rollouts, from its own process:
    the project's on XLA, TRL's on the CPU without XLA."""
    out = setup["base"] / f"{side}-{loss_type}-{beta}.pt"
    request = {
        "side": side, "model": str(setup["model"]), "policy": str(setup["policy"]),
        "prompts": setup["prompts"], "completions": setup["completions"], "out": str(out),
        "grpo": grpo_table(setup, loss_type, beta),
    }  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    if side == "trl":
        env = {k: v for k, v in env.items() if not k.startswith(("PJRT_", "XLA_"))}
        env["USE_TORCH_XLA"] = "0"
    done = subprocess.run(
        [sys.executable, __file__, json.dumps(request)], env=env, capture_output=True,
        text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = torch.load(out)
    return result


def ours_side(request: dict[str, Any]) -> dict[str, Any]:
    """The project's GRPO objective on the fixed rollouts: its rewards, advantages, rows and
    loss, on an XLA device."""
    import copy
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from {{ cookiecutter.package_name }}.alignment.grpo import GrpoSettings
    from {{ cookiecutter.package_name }}.alignment.rollouts import GrpoObjective, Prompt
    from {{ cookiecutter.package_name }}.core import ops, runtime

    settings = GrpoSettings.from_dict(request["grpo"])
    tokenizer = AutoTokenizer.from_pretrained(request["model"])
    objective = GrpoObjective(SimpleNamespace(tokenizer=tokenizer, name="hf-causal-lm"), settings)
    device = runtime.device()
    model = AutoModelForCausalLM.from_pretrained(request["policy"]).to(device)
    model.tie_weights()  # the move to the device untied the tiny Llama's embeddings
    if settings.beta:
        reference = AutoModelForCausalLM.from_pretrained(request["model"]).to(device).eval()
        objective.reference = copy.deepcopy(reference)
    prompts = [Prompt(ids, f"prompt {i}", {}) for i, ids in enumerate(request["prompts"])]
    repeated = [prompt for prompt in prompts for _ in range(GROUP)]
    completions = request["completions"]
    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    scores = objective.score(repeated, completions, texts)
    host, metrics = objective.rows(repeated, completions, scores)
    batch = {key: value.to(device) for key, value in host.items()}
    loss = objective.loss(model, batch)
    loss.backward()
    ops.sync()
    device_metrics = objective.train_metrics(model)
    metrics.update({name: float(value.cpu()) for name, value in device_metrics.items()})
    grads = {name: p.grad.cpu() for name, p in model.named_parameters() if p.grad is not None}
    return {"loss": float(loss.detach().cpu()), "grads": grads, "metrics": metrics,
            "advantages": host["advantages"]}  # fmt: skip


def trl_side(request: dict[str, Any]) -> dict[str, Any]:
    """TRL's GRPOTrainer on the same rollouts (its `rollout_func`) and reward functions: its
    `_generate_and_score_completions`, then `compute_loss` and the backward pass."""
    import importlib.util

    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    table = request["grpo"]
    path = table["reward_funcs"][0].rpartition(":")[0]
    spec = importlib.util.spec_from_file_location("rewards_fixed", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    completions, prompts = request["completions"], request["prompts"]

    def rollout(given: list[Any], trainer: Any) -> dict[str, Any]:
        assert len(given) == len(completions)
        return {"prompt_ids": [prompts[i // GROUP] for i in range(len(completions))],
                "completion_ids": completions,
                "logprobs": [[0.0] * len(ids) for ids in completions]}  # fmt: skip

    tokenizer = AutoTokenizer.from_pretrained(request["model"])
    model = AutoModelForCausalLM.from_pretrained(request["policy"])
    model.config._name_or_path = request["model"]  # TRL builds its reference from here
    args = GRPOConfig(
        output_dir=str(Path(request["out"]).parent / "trl"), use_cpu=True, bf16=False,
        per_device_train_batch_size=len(completions), num_generations=GROUP,
        max_completion_length=table["max_completion_length"], loss_type=table["loss_type"],
        beta=table["beta"], temperature=table["temperature"],
        reward_weights=table["reward_weights"], report_to=[], save_strategy="no",
        disable_tqdm=True, seed=0,
    )  # fmt: skip
    dataset = datasets.Dataset.from_list([{"prompt": f"prompt {i}"} for i in range(PROMPTS)])
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    trainer = GRPOTrainer(
        model=model, reward_funcs=[module.fixed, module.short], args=args,
        train_dataset=dataset, processing_class=tokenizer, rollout_func=rollout,
    )  # fmt: skip
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    inputs = [{"prompt": f"prompt {i // GROUP}"} for i in range(len(completions))]
    scored = trainer._generate_and_score_completions(inputs)
    loss = trainer.compute_loss(trainer.model, scored)
    loss.backward()
    metrics = {name: float(values[-1]) for name, values in trainer._metrics["train"].items()}
    grads = {name: p.grad for name, p in trainer.model.named_parameters() if p.grad is not None}
    return {"loss": float(loss.detach()), "grads": grads, "metrics": metrics,
            "advantages": scored["advantages"]}  # fmt: skip


@pytest.mark.parametrize(
    ("loss_type", "beta"), [("grpo", 0.0), ("dapo", 0.0), ("dr_grpo", 0.0), ("dapo", 0.04)]
)
def test_loss_gradients_and_metrics_on_fixed_rollouts_are_trls(
    setup: dict[str, Any], loss_type: str, beta: float
) -> None:
    """On the same rollouts and rewards, the project's advantages, loss, every parameter's
    gradient and TRL's logged metrics equal GRPOTrainer's within 1e-5."""
    ours = run_side(setup, "ours", loss_type, beta)
    theirs = run_side(setup, "trl", loss_type, beta)
    torch.testing.assert_close(ours["advantages"], theirs["advantages"], rtol=1e-5, atol=1e-5)
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5, abs=1e-5)
    assert set(ours["grads"]) == set(theirs["grads"]) and ours["grads"]
    for name, grad in ours["grads"].items():
        torch.testing.assert_close(grad, theirs["grads"][name], rtol=1e-5, atol=1e-5, msg=name)
    assert any(float(g.abs().max()) > 1e-4 for g in ours["grads"].values())  # not all zero
    names = METRICS + (("kl",) if beta else ())
    for name in names:
        close = pytest.approx(theirs["metrics"][name], rel=1e-5, abs=1e-5)
        assert ours["metrics"][name] == close, name


ADDITION_REWARDS = '''
def exact(completions, answer, **kwargs):
    """1 where the completion's first word is the sum, exactly."""
    return [1.0 if (text.split() or [""])[0] == want else 0.0
            for text, want in zip(completions, answer)]


def digit_first(completions, **kwargs):
    """A quarter where the completion starts with a digit (the answer's format)."""
    return [0.25 if text.strip()[:1].isdigit() else 0.0 for text in completions]
'''
FIT_STEPS = 30


def write_addition(base: Path, count: int = 64, seed: int = 2) -> Path:
    """Prompts `a+b=` (the sum a digit) with their `answer` column, and the reward file."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a = rng.randint(0, 4)
        b = rng.randint(0, 9 - a)
        rows.append({"prompt": f"{a}+{b}=", "answer": str(a + b)})
    (base / "addition_rewards.py").write_text(ADDITION_REWARDS)
    path = base / "addition.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def addition_config(setup: dict[str, Any], run_dir: Path, **grpo: Any) -> dict[str, Any]:
    base = setup["base"]
    rewards = base / "addition_rewards.py"
    table = {
        "prompts": str(write_addition(base)), "num_generations": 8, "max_prompt_length": 8,
        "reward_funcs": [f"{rewards}:exact", f"{rewards}:digit_first"],
        "max_completion_length": 3, "temperature": 1.0, "check_every": 4, **grpo,
    }  # fmt: skip
    return {
        "task": "hf-causal-lm", "task_options": {"model_name": str(setup["model"])},
        "objective": "grpo", "grpo": table, "accelerator": "cpu", "devices": 1,
        "strategy": "single", "batch_size": 32, "max_steps": FIT_STEPS, "lr": 0.01,
        "warmup_steps": 0, "log_every": 1, "eval_every": 0, "run_dir": str(run_dir),
        "precision": "32-true",
    }  # fmt: skip


def grpo_fit(request: dict[str, Any]) -> dict[str, Any]:
    """A guarded GRPO run (the guard armed after warm-up); its summary and each step's
    logged rewards from TensorBoard (child process)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from {{ cookiecutter.package_name }}.core import launch
    from {{ cookiecutter.package_name }}.training import build_config, fit, plan_of

    config = build_config(None, request["config"])
    plan = plan_of(config)
    summary = dict(launch(fit, plan, (config, plan, None, None, 2)))
    events = EventAccumulator(str(Path(config.run_dir) / "tensorboard"))
    events.Reload()
    summary["rewards"] = [event.value for event in events.Scalars("train/reward")]
    from {{ cookiecutter.package_name }}.goodput import account, store
    from {{ cookiecutter.package_name }}.training.checkpoint import default_directory

    location = store.records_location(default_directory(config.run_dir, config.checkpoint_dir))
    result = account.account(store.read_events(location))
    summary["goodput_events"] = result["badput_seconds"]["custom_badput_events"]
    return summary


@pytest.mark.parametrize(
    "devices", [1, pytest.param(MANY_DEVICES, marks=pytest.mark.slow, id="mesh")], ids=str
)
def test_the_mean_reward_rises_on_a_task_with_one_graph_per_kind(
    setup: dict[str, Any], python_subprocess: Any, devices: int
) -> None:
    """On prompts `a+b=` scored by the sum (checked exactly) and its format, a tiny model's
    mean reward over the last 10 of 30 steps is above the first 10's; the step, the prompts'
    prefill and the decode step compile at warm-up and nothing after. On the mesh too (the
    model sharded, the rollouts' rows split over the devices)."""
    run_dir = setup["base"] / f"addition-run-{devices}"
    config = addition_config(setup, run_dir)
    if devices > 1:
        config.update(devices=devices, strategy=SHARDED, batch_size=32 // devices)
    request = {"side": "fit", "config": config}
    summary = python_subprocess([__file__, json.dumps(request)], env={})
    assert summary["status"] == "completed" and summary["steps"] == FIT_STEPS
    rewards = summary["rewards"]
    assert len(rewards) == FIT_STEPS
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    print(f"mean reward: steps 1-10 {first:.4f}, steps 21-30 {last:.4f}")
    assert last > first + 0.05, rewards
    guard = summary["guard"]
    assert guard["compilations"] == 0 and guard["transfers"] <= guard["allowed_transfers"]
    assert summary["diagnosis"] == [] and summary["fallback_ops"] == {}
    for name in ("rewards/exact/mean", "rewards/digit_first/mean", "entropy",
                 "completions/mean_length", "frac_reward_zero_std"):  # fmt: skip
        assert name in summary["train_metrics"], name
    assert summary["goodput_events"]["rollouts"] > 0  # the rollouts' own goodput category


def test_built_in_rewards_check_answers_by_value_and_exactly() -> None:
    """`math_answer` compares answers through math-verify (1/2 is 0.5; a wrong value is 0; an
    answer it cannot parse gives None); `exact_answer` compares the stripped text."""
    from {{ cookiecutter.package_name }}.alignment.rewards import Rewards

    rewards = Rewards(["math_answer", "exact_answer"], [])
    completions = ["The answer is $0.5$.", "It is $\\frac{3}{4}$", " 7 ", "so 12"]
    answers = ["$\\frac{1}{2}$", "0.5", "7", "nothing to parse"]
    scores = rewards(["q"] * 4, completions, [[1]] * 4, {"answer": answers})
    assert rewards.names == ["math_answer", "exact_answer"]
    assert scores[:3, 0].tolist() == [1.0, 0.0, 1.0] and torch.isnan(scores[3, 0])
    assert scores[:, 1].tolist() == [0.0, 0.0, 1.0, 0.0]


REFUSALS = {
    "group-does-not-divide": ("batch", "does not divide the global batch of 12"),
    "reward-raises": ("reward", "reward function 'broken' raised RuntimeError('no answer key')"),
    "no-prompt-column": ("prompts", "have no 'prompt' column"),
}


@pytest.mark.parametrize(("broken", "message"), REFUSALS.values(), ids=REFUSALS)
def test_what_grpo_cannot_run_is_refused_in_one_line(
    setup: dict[str, Any], broken: str, message: str
) -> None:
    """It refuses, in one line and exit 2, a group size that does not divide the batch, a
    reward function that raises (naming it) and prompts without a prompt column; it writes
    no checkpoint."""
    from training_helpers import cli

    base = setup["base"]
    run_dir = base / f"refused-{broken}"
    config = addition_config(setup, run_dir)
    if broken == "batch":
        config["batch_size"] = 12  # groups of 8
    elif broken == "reward":
        config["grpo"]["reward_funcs"] = [f"{base / 'rewards_fixed.py'}:broken"]
    else:
        (base / "no-prompt.jsonl").write_text('{"question": "1+1="}\n')
        config["grpo"]["prompts"] = str(base / "no-prompt.jsonl")
    path = base / f"refused-{broken}.toml"
    path.write_text(toml_text(config))
    done = cli("train", "--config", str(path), "--max-steps", "2")
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    checkpoints = run_dir / "checkpoints"
    assert not checkpoints.exists() or not any(checkpoints.iterdir())


def toml_text(config: dict[str, Any]) -> str:
    """A config as TOML: its keys, then its tables."""
    plain = {k: v for k, v in config.items() if not isinstance(v, dict)}
    lines = [f"{key} = {json.dumps(value)}" for key, value in plain.items()]
    for name, table in config.items():
        if isinstance(table, dict):
            lines.append(f"[{name}]")
            lines += [f"{key} = {json.dumps(value)}" for key, value in table.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    REQUEST = json.loads(sys.argv[1])
    if REQUEST["side"] == "fit":
        print(json.dumps(grpo_fit(REQUEST)))
    else:
        RESULT = (ours_side if REQUEST["side"] == "ours" else trl_side)(REQUEST)
        torch.save(RESULT, REQUEST["out"])
