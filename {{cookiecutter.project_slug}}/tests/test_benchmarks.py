"""Benchmark tasks through lm-evaluation-harness: on local tasks the test writes (multiple
choice, generation, rolling log-likelihood), every request's log-likelihood and every metric
equal lm-eval's own `hf` model's on the CPU with the same weights, on one device and on the
mesh; a task lm-eval does not know is refused in one line."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from backend_facts import MANY_DEVICES, SHARDED
from hf_helpers import save_tiny_pretrained
from training_helpers import cli

pytestmark = pytest.mark.hf

BUCKETS = "32,64"  # the tiny model takes 64 positions
MAX_LENGTH = 64
TASKS = "tiny_arc,tiny_gsm,tiny_rolling"
WORDS = ["red", "blue", "green", "cat", "dog", "tree", "house", "river", "sun", "moon"]
# lm-eval's task YAML (its Jinja, kept from this project's templating).
{% raw -%}
ARC_YAML = """task: tiny_arc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
  - metric: acc_norm
"""
GSM_YAML = """task: tiny_gsm
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Q: {{{{question}}}}\\nA:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n", "Q:"]
  do_sample: false
  max_gen_toks: 12
metric_list:
  - metric: exact_match
    ignore_case: true
    ignore_punctuation: true
"""
ROLLING_YAML = """task: tiny_rolling
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: "{{{{text}}}}"
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
"""
{%- endraw %}


def write_tasks(folder: Path) -> Path:
    """Three tasks and their data: 50 four-way questions, 20 sums, 6 passages."""
    rng = random.Random(5)
    folder.mkdir(parents=True, exist_ok=True)
    arc = []
    for _ in range(50):
        choices = rng.sample(WORDS, 4)
        arc.append({"question": f"which is {choices[0]}?", "choices": choices, "answer": 0})
    gsm = [{"question": f"{a} plus {b}?", "answer": str(a + b)}
           for a, b in ((rng.randint(1, 9), rng.randint(1, 9)) for _ in range(20))]  # fmt: skip
    rolling = [{"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40)))}
               for _ in range(6)]  # fmt: skip
    for name, rows, yaml in (("arc", arc, ARC_YAML), ("gsm", gsm, GSM_YAML),
                             ("rolling", rolling, ROLLING_YAML)):  # fmt: skip
        data = folder / f"{name}.jsonl"
        data.write_text("".join(json.dumps(row) + "\n" for row in rows))
        (folder / f"{name}.yaml").write_text(yaml.format(data=data))
    return folder


def varied_model(folder: Path) -> Path:
    """A tiny Llama whose matrices are drawn wide enough that its greedy completions differ
    from prompt to prompt (a freshly initialized one repeats one token)."""
    import torch
    from transformers import AutoModelForCausalLM

    save_tiny_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                wide = torch.randn(param.shape, generator=generator) * 4 / param.shape[1] ** 0.5
                param.copy_(wide)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("benchmarks")
    model, tasks = varied_model(base / "model"), write_tasks(base / "tasks")
    return {"base": base, "model": model, "tasks": tasks}


def samples(out: Path, task: str) -> list[dict[str, Any]]:
    lines = (out / f"samples_{task}.jsonl").read_text().splitlines()
    return sorted((json.loads(line) for line in lines), key=lambda r: r["doc_id"])


@pytest.fixture(scope="module")
def reference(setup: dict[str, Path]) -> dict[str, Any]:
    """lm-eval's own `hf` model on the CPU: results and per-sample records of the tasks."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    lm = HFLM(pretrained=str(setup["model"]), device="cpu", batch_size=8, max_length=MAX_LENGTH)
    manager = TaskManager(include_path=str(setup["tasks"]))
    results = simple_evaluate(
        model=lm, tasks=TASKS.split(","), task_manager=manager, log_samples=True,
        bootstrap_iters=0,
    )  # fmt: skip
    return dict(results or {})


def run_eval(setup: dict[str, Path], name: str, *args: str) -> tuple[Any, Path]:
    out = setup["base"] / name
    done = cli(
        "eval", "--tasks", TASKS, "--include-path", str(setup["tasks"]), "--log-samples",
        "--out", str(out), "--buckets", BUCKETS, "--slots", "8", "--accelerator", "cpu",
        "--set", "task=hf-causal-lm", "--set", f"task_options.model_name={setup['model']}",
        *args,
    )  # fmt: skip
    return done, out


def assert_like_reference(out: Path, reference: dict[str, Any]) -> None:
    for task in ("tiny_arc", "tiny_rolling"):
        ours = samples(out, task)
        theirs = sorted(reference["samples"][task], key=lambda r: r["doc_id"])
        assert len(ours) == len(theirs) > 0
        for mine, own in zip(ours, theirs, strict=True):
            for a, b in zip(mine["resps"], own["resps"], strict=True):
                value_a = a[0][0] if isinstance(a[0], list) else a[0]
                value_b = b[0][0] if isinstance(b[0], (list, tuple)) else b[0]
                # 1e-4, relative above 1: lm-eval sums a passage's tokens in fp32, this
                # project in fp64 (over ~100 tokens their sums part by ~1e-4)
                assert float(value_a) == pytest.approx(float(value_b), rel=1e-4, abs=1e-4)
    ours_gsm = [r["resps"] for r in samples(out, "tiny_gsm")]
    theirs = sorted(reference["samples"]["tiny_gsm"], key=lambda r: r["doc_id"])
    assert ours_gsm == [r["resps"] for r in theirs]
    assert len({json.dumps(r) for r in ours_gsm}) > 5  # completions of their own, not one
    results = json.loads((out / "results.json").read_text())["results"]
    for task, metrics in reference["results"].items():
        for key, value in metrics.items():
            if isinstance(value, float) and "stderr" not in key:
                assert results[task][key] == pytest.approx(value, rel=1e-4, abs=1e-6), (task, key)


def test_benchmark_tasks_score_as_lm_evals_own_model_on_one_device(
    setup: dict[str, Path], reference: dict[str, Any]
) -> None:
    """It gives every request lm-eval's `hf` log-likelihood (within 1e-4), its generations,
    and its metrics, writing lm-eval's results JSON and a table."""
    done, out = run_eval(setup, "one-device")
    assert done.returncode == 0, done.stderr[-3000:]
    assert_like_reference(out, reference)
    assert "tiny_arc" in done.stdout and "|" in done.stdout  # lm-eval's table
    metrics = json.loads(done.stdout.strip().splitlines()[-1])
    assert "tiny_arc/acc" in metrics and "tiny_gsm/exact_match" in metrics


@pytest.mark.slow
def test_benchmark_tasks_score_alike_on_the_mesh(
    setup: dict[str, Path], reference: dict[str, Any]
) -> None:
    """It scores the tasks as lm-eval's own model does with the model sharded as training
    shards it."""
    done, out = run_eval(setup, "mesh", "--devices", str(MANY_DEVICES), "--strategy", SHARDED)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_like_reference(out, reference)


def test_a_task_lm_eval_does_not_know_is_refused_in_one_line(setup: dict[str, Path]) -> None:
    """It refuses an unknown task in one line, exit 2, before a model is built or a file
    written."""
    out = setup["base"] / "unknown"
    done = cli(
        "eval", "--tasks", "tiny_arc,no_such_task", "--include-path", str(setup["tasks"]),
        "--out", str(out), "--accelerator", "cpu",
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "lm-eval knows no task 'no_such_task'" in line
    assert not out.exists()


@pytest.mark.slow
def test_eval_tasks_during_training_are_logged_at_each_evaluation(
    setup: dict[str, Path],
) -> None:
    """It runs `eval_tasks` beside the loss evaluation every `eval_every` steps of a 30-step
    fine-tune and logs `eval/<task>/<metric>` to TensorBoard at each."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = setup["base"] / "during"
    done = cli(
        "train", "--set", "task=hf-causal-lm", "--set", f"task_options.model_name={setup['model']}",
        "--set", "task_options.seq_len=32", "--set", "task_options.max_bytes=20000",
        "--set", 'eval_tasks=["tiny_arc", "tiny_gsm"]',
        "--set", f"eval_tasks_path={setup['tasks']}", "--set", "eval_tasks_limit=8",
        "--set", "eval_tasks_buckets=[32, 64]", "--set", "eval_batches=2",
        "--max-steps", "30", "--eval-every", "10", "--batch-size", "4", "--log-every", "10",
        "--run-dir", str(run_dir), "--accelerator", "cpu",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    for tag in ("eval/tiny_arc/acc", "eval/tiny_gsm/exact_match", "eval/loss"):
        assert [event.step for event in events.Scalars(tag)] == [10, 20, 30], tag
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "tiny_arc/acc_norm" in summary["eval"]
