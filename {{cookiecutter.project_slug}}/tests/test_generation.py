"""Generation from the model where it trained: transformers' own greedy tokens on one device and
on every layout, a fixed set of compiled graphs, seeded sampling alike on every layout, LoRA
live equal to LoRA merged, and what the engine cannot run refused in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from backend_facts import MANY_DEVICES, SHARDED
from training_helpers import cli

pytestmark = pytest.mark.hf

# Prompts of eight lengths (1 to 27 bytes), over two buckets.
TEXTS = [
    "x", "def f(", "import os\n", "class Foo:\n    ", "for i in range(3):",
    "return self.value", "if __name__ == '__main__':", "with open(path) as f:\n    da",
]  # fmt: skip
NEW_TOKENS, CHECK_EVERY = 32, 8
BUCKETS = (16, 32)
OPTIONS = {"seq_len": 32, "dim": 32, "layers": 2, "heads": 4, "kv_heads": 2, "max_bytes": 20000}
MIXTURE = {"experts": 4, "experts_per_token": 2}


def prompt_ids(texts: list[str]) -> list[list[int]]:
    from {{ cookiecutter.package_name }}.hf.byte_tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    return [list(tokenizer.encode(text)) for text in texts]


def options(architecture: str) -> dict[str, Any]:
    mixture = MIXTURE if architecture == "mixtral" else {}
    return {**OPTIONS, "architecture": architecture, **mixture}


def generation_job(request: dict[str, Any]) -> dict[str, Any]:
    """In a child process: the model laid out as asked, its engine warmed up, then each batch
    of prompts generated; the tokens, and the graphs and reads it took."""
    from {{ cookiecutter.package_name }}.core import launch
    from {{ cookiecutter.package_name }}.training import build_config, plan_of

    config = build_config(
        None,
        {"task": "hf-causal-lm", "accelerator": "cpu", "devices": request["devices"],
         "strategy": request["strategy"], "task_options": options(request["architecture"]),
         **request.get("config", {})},
    )  # fmt: skip
    plan = plan_of(config)

    launch(generation_run, plan, (config, plan, request))
    return dict(json.loads(Path(request["out"]).read_text()))


def generation_run(config: Any, plan: Any, request: dict[str, Any]) -> dict[str, Any]:
    """In every process of the job: what `generation_job` reports (the first writes it)."""
    from {{ cookiecutter.package_name }}.core import health, memory
    from {{ cookiecutter.package_name }}.generation import Engine, Sampling, Shape
    from {{ cookiecutter.package_name }}.generation.model import load_model

    loaded = load_model(config, plan)
    if request.get("lora_noise"):  # adapters that change the outputs (B starts at zero)
        generator = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for name, param in loaded.model.named_parameters():
                if "lora_B" in name:
                    noise = torch.randn(param.shape, generator=generator) * 0.5
                    param.copy_(noise.to(param.dtype).to(param.device))
    shape = Shape(request.get("slots", 8), BUCKETS, NEW_TOKENS, CHECK_EVERY)
    sampling = Sampling(**request.get("sampling", {}))
    results: dict[str, Any] = {}
    for merged in [False, True] if request.get("lora_noise") else [False]:
        if merged:
            loaded.model.merge_adapter()
        engine = Engine(loaded.model, loaded.tokenizer, plan.strategy, shape, sampling)
        before = health.snapshot()
        engine.warm_up()
        warm = health.snapshot()
        batches = [engine.generate(batch) for batch in request["batches"]]
        after = health.snapshot()
        results["merged" if merged else "live"] = [[c.tokens for c in b] for b in batches]
        results["warm_up_graphs"] = warm.compilations - before.compilations
        results["graphs_after_warm_up"] = after.compilations - warm.compilations
        results["reads"] = engine.timing.reads
        results["steps"] = engine.timing.steps
        layers: list[Any] = list(engine.cache.layers)
        results["cache_bytes_per_device"] = sum(
            memory.tensor_bytes(t)[1] for layer in layers for t in (layer.keys, layer.values)
        )
    if plan.strategy.is_master():
        Path(request["out"]).write_text(json.dumps(results))
    return results


def generate(python_subprocess: Any, tmp_path: Path, **request: Any) -> dict[str, Any]:
    """`generation_job(request)` in a fresh interpreter (the runtime's layout is set once)."""
    request = {"devices": "1", "strategy": "single", "batches": [prompt_ids(TEXTS)], **request}
    request["out"] = str(tmp_path / f"generated-{len(list(tmp_path.iterdir()))}.json")
    return dict(python_subprocess([__file__, json.dumps(request)], env={}))


def transformers_generate(architecture: str, prompts: list[list[int]]) -> list[list[int]]:
    """transformers' own greedy `generate`, eager on the CPU with its default cache, one prompt
    at a time, on the weights the project builds from the same seed."""
    from {{ cookiecutter.package_name }}.core.materialize import fill_whole
    from {{ cookiecutter.package_name }}.tasks import load_task
    from {{ cookiecutter.package_name }}.training import build_config
    from {{ cookiecutter.package_name }}.training.model import build

    config = build_config(None, {"task": "hf-causal-lm", "task_options": options(architecture)})
    task = load_task(config.task, config.data, config.task_options)
    built = build(task, config)
    model = built.model
    fill_whole(model, built.source, "cpu")
    model.eval()
    model.set_attn_implementation("eager")
    if getattr(model.config, "num_local_experts", 0):
        model.set_experts_implementation("eager")  # transformers' own experts, not the project's
    model.config.use_cache = True
    outputs = []
    for prompt in prompts:
        ids = model.generate(
            torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False,
            eos_token_id=None, pad_token_id=0,
        )  # fmt: skip
        outputs.append(ids[0, len(prompt) :].tolist())
    return outputs


SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "architecture",
    ["llama", pytest.param("qwen2", marks=SLOW), pytest.param("gemma", marks=SLOW),
     pytest.param("mixtral", marks=SLOW)],
)  # fmt: skip
def test_greedy_tokens_are_transformers_own_on_one_device(
    architecture: str, python_subprocess: Any, tmp_path: Path
) -> None:
    """It generates, greedily, the 32 tokens transformers' eager `generate` gives each of 8
    prompts of different lengths, batched in left-padded slots."""
    ran = generate(python_subprocess, tmp_path, architecture=architecture)
    assert ran["live"][0] == transformers_generate(architecture, prompt_ids(TEXTS))


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["llama", "qwen2", "gemma", "mixtral"])
def test_greedy_tokens_on_every_device_of_the_mesh_are_transformers_own(
    architecture: str, python_subprocess: Any, tmp_path: Path
) -> None:
    """It generates transformers' own tokens with the model sharded as training shards it."""
    ran = generate(
        python_subprocess, tmp_path, architecture=architecture, devices=str(MANY_DEVICES),
        strategy=SHARDED,
    )  # fmt: skip
    assert ran["live"][0] == transformers_generate(architecture, prompt_ids(TEXTS))


def test_a_prefill_per_bucket_and_one_decode_step_compile_and_nothing_after(
    python_subprocess: Any, tmp_path: Path
) -> None:
    """It compiles one prefill per bucket and one decode step at warm-up and nothing over
    three batches of other prompt lengths, reading the device once every 8 tokens."""
    batches = [prompt_ids(TEXTS), prompt_ids([t * 2 for t in TEXTS[:4]]), prompt_ids(TEXTS[3:])]
    ran = generate(python_subprocess, tmp_path, architecture="llama", batches=batches)
    assert ran["warm_up_graphs"] == len(BUCKETS) + 1
    assert ran["graphs_after_warm_up"] == 0
    assert ran["reads"] <= ran["steps"] / (CHECK_EVERY - 1)  # a read per k tokens, one per batch


def test_nothing_compiles_after_warm_up(python_subprocess: Any, tmp_path: Path) -> None:
    """It compiles no graph once warmed up, over batches of other prompt lengths and sizes."""
    batches = [prompt_ids(TEXTS[:3]), prompt_ids([t * 3 for t in TEXTS[:2]])]
    ran = generate(python_subprocess, tmp_path, architecture="llama", batches=batches)
    assert ran["graphs_after_warm_up"] == 0 and ran["warm_up_graphs"] > 0


SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "seed": 7}


@pytest.mark.slow
def test_a_seed_samples_the_same_tokens_on_every_layout(
    python_subprocess: Any, tmp_path: Path
) -> None:
    """It samples (temperature, top-k, top-p) the same tokens with one seed on one device and
    on the mesh, and other tokens with another seed."""
    one = generate(python_subprocess, tmp_path, architecture="llama", sampling=SAMPLING)
    mesh = generate(
        python_subprocess, tmp_path, architecture="llama", sampling=SAMPLING,
        devices=str(MANY_DEVICES), strategy=SHARDED,
    )  # fmt: skip
    other = generate(
        python_subprocess, tmp_path, architecture="llama", sampling={**SAMPLING, "seed": 8}
    )
    greedy = transformers_generate("llama", prompt_ids(TEXTS))
    assert one["live"] == mesh["live"]
    assert one["live"] != other["live"] and one["live"][0] != greedy


def test_sampling_noise_depends_only_on_the_seed_the_prompt_and_the_step() -> None:
    """It draws the same noise for a prompt whatever row it sits in, and other noise for
    another seed, prompt or step."""
    from {{ cookiecutter.package_name }}.generation.sampling import uniform_noise

    step = torch.tensor(3)
    rows = uniform_noise(7, torch.tensor([5, 9]), step, 50)
    swapped = uniform_noise(7, torch.tensor([9, 5]), step, 50)
    assert torch.equal(rows, swapped.flip(0))
    assert not torch.equal(rows, uniform_noise(8, torch.tensor([5, 9]), step, 50))
    assert not torch.equal(rows, uniform_noise(7, torch.tensor([5, 9]), torch.tensor(4), 50))
    assert float(rows.min()) > 0 and float(rows.max()) < 1


@pytest.mark.slow
def test_lora_adapters_kept_apart_generate_what_they_generate_merged(
    python_subprocess: Any, tmp_path: Path
) -> None:
    """It generates the same tokens with LoRA adapters live and merged into the base."""
    ran = generate(
        python_subprocess, tmp_path, architecture="llama", lora_noise=True,
        config={"lora": {"rank": 4, "alpha": 8}},
    )  # fmt: skip
    assert ran["live"] == ran["merged"]
    assert ran["live"][0] != transformers_generate("llama", prompt_ids(TEXTS))  # they act


def test_generate_writes_json_lines_with_token_counts(tmp_path: Path) -> None:
    """It writes one JSON line per prompt, the prompt's and the completion's token counts."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def f("}\n{"prompt": "import os"}\n')
    out = tmp_path / "out.jsonl"
    done = cli(
        "generate", "--set", "task_options.dim=32", "--set", "task_options.layers=1",
        "--prompts", str(prompts), "--prompt", "x = ", "--max-new-tokens", "5",
        "--buckets", "16", "--slots", "2", "--out", str(out), "--accelerator", "cpu",
        "--set", "task=hf-causal-lm",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["prompt"] for line in lines] == ["x = ", "def f(", "import os"]
    assert [line["prompt_tokens"] for line in lines] == [4, 6, 9]
    assert all(line["completion_tokens"] == 5 for line in lines)
    assert "tokens/s" in done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("devices", "accelerator_type"),
    [("1", "v5litepod-1"), *([(str(MANY_DEVICES), "v5litepod-8")] if MANY_DEVICES == 8 else [])],
)
def test_plan_counts_the_key_value_cache_each_device_holds(
    devices: str, accelerator_type: str, python_subprocess: Any, tmp_path: Path
) -> None:
    """It gives, for `--slots` and `--max-length`, the cache bytes each device holds when the
    engine runs that shape on that mesh."""
    strategy = "single" if devices == "1" else SHARDED
    ran = generate(
        python_subprocess, tmp_path, architecture="llama", devices=devices, strategy=strategy,
        batches=[prompt_ids(TEXTS[:2])],
    )  # fmt: skip
    config = tmp_path / "plan.toml"
    config.write_text(
        'task = "hf-causal-lm"\n[task_options]\n'
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in options("llama").items())
    )
    max_length = BUCKETS[-1] + NEW_TOKENS
    planned = cli(
        "plan", "--config", str(config), "--accelerator-type", accelerator_type,
        "--mesh", f"fsdp={devices}", "--slots", "8", "--max-length", str(max_length), "--json",
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr[-2000:]
    generation = json.loads(planned.stdout)["generation"]
    assert generation["cache_bytes_per_device"] == ran["cache_bytes_per_device"] > 0
    assert generation["fits"] is True


OVER_V5E = ["--accelerator-type", "v5litepod-8"]
REFUSED = {
    "prompt-longer-than-the-largest-bucket": (
        ["--prompt", "y" * 40, "--buckets", "16,32"],
        "a prompt of 40 tokens is longer than the largest bucket (32)",
    ),
    "buckets-not-ascending": (["--prompt", "x", "--buckets", "32,16"], "buckets must be ascending"),
    "no-prompt": ([], "no prompts"),
    "slots-over-the-hbm": (
        ["--prompt", "x", "--slots", "200000", "--buckets", "4096", *OVER_V5E],
        "200000 slots of 4224 tokens do not fit v5litepod-8",
    ),
    "bad-top-p": (["--prompt", "x", "--temperature", "1", "--top-p", "0"], "top_p must be in"),
}


@pytest.mark.parametrize(("args", "message"), REFUSED.values(), ids=REFUSED)
def test_what_generate_cannot_run_is_refused_in_one_line(
    args: list[str], message: str, tmp_path: Path
) -> None:
    """It refuses, in one line with exit code 2 and nothing written, what it cannot run."""
    out = tmp_path / "out.jsonl"
    done = cli(
        "generate", "--set", "task=hf-causal-lm", "--set", "task_options.dim=32",
        "--accelerator", "cpu", "--out", str(out), *args,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert not out.exists()


def test_a_checkpoint_of_another_model_is_refused_in_one_line(tmp_path: Path) -> None:
    """It refuses to generate from a checkpoint a run of another model saved."""
    run_dir = tmp_path / "run"
    trained = cli(
        "train", "--set", "task=hf-causal-lm", "--set", "task_options.dim=32",
        "--set", "task_options.layers=1", "--set", "task_options.max_bytes=20000",
        "--max-steps", "1", "--eval-every", "0", "--run-dir", str(run_dir), "--accelerator", "cpu",
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-2000:]
    other = tmp_path / "other.toml"
    other.write_text('task = "hf-causal-lm"\n[task_options]\ndim = 64\nlayers = 1\n')
    done = cli(
        "generate", "--config", str(other), "--checkpoint", str(run_dir / "checkpoints"),
        "--prompt", "x", "--out", str(tmp_path / "out.jsonl"),
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "holds another model: its task_options is" in line
    assert not (tmp_path / "out.jsonl").exists()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    print(json.dumps(generation_job(json.loads(sys.argv[1]))))
