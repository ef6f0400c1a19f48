"""Tokens/s of the generation engine against transformers' `generate`, on one device.

    python benchmarks/generate_bench.py [--size 100m] [--batches 1,8] [--prompt-tokens 64]
                                        [--new-tokens 64] [--out runs/generate-bench]

The same model (the hf-causal-lm example's Llama at about 100M parameters: dim 768, 12
layers, 12 heads, an MLP of 2048, the byte vocabulary; seeded, nothing downloaded) and the
same prompts, greedy, every contender generating exactly `--new-tokens` (no end id), each in
a process of its own:

- `engine`: this project's engine on the device (`generate`'s own: static cache, one prefill
  bucket, the replayed decode step), its warm-up (compiling) timed apart;
- `transformers (device)`: transformers' `generate` on the same device, with its static
  cache (`cache_implementation="static"`), where transformers allows it;
- `transformers (cpu, eager)`: transformers' `generate` in plain PyTorch on the CPU with its
  default cache.

For each, the first call (compiling included) and the median of the next `--rounds` calls
(the steady state) are timed; tokens/s is `batch x new tokens / steady seconds`, and the
table gives each contender's ratio to transformers on the device and on the CPU, measured in
one run: compare ratios, never seconds across runs (timings here swing 20% from run to run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SIZES = {
    "tiny": {"dim": 64, "layers": 2, "heads": 4, "kv_heads": 4, "mlp_dim": 128},
    "100m": {"dim": 768, "layers": 12, "heads": 12, "kv_heads": 12, "mlp_dim": 2048},
}
CONTENDERS = ("engine", "transformers (device)", "transformers (cpu, eager)")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="100m")
    parser.add_argument("--batches", default="1,8", help="prompts generated at once")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="steady-state calls timed")
    parser.add_argument("--out", default="runs/generate-bench")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser


def build(size: str) -> Any:
    """The seeded model, whole on the host (the project builds it so for any layout)."""
    from {{ cookiecutter.package_name }}.core.materialize import fill_whole
    from {{ cookiecutter.package_name }}.tasks import load_task
    from {{ cookiecutter.package_name }}.training import build_config
    from {{ cookiecutter.package_name }}.training.model import build as build_model

    options = {"architecture": "llama", "seq_len": 64, **SIZES[size]}
    config = build_config(None, {"task": "hf-causal-lm", "task_options": options})
    task = load_task(config.task, config.data, config.task_options)
    built = build_model(task, config)
    fill_whole(built.model, built.source, "cpu")
    return config, built.model


def prompts(batch: int, length: int) -> list[list[int]]:
    return [[(7 * row + 3 * i) % 200 + 32 for i in range(length)] for row in range(batch)]


def timed(call: Any, rounds: int) -> dict[str, float]:
    started = time.perf_counter()
    call()
    first = time.perf_counter() - started
    steady = []
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        steady.append(time.perf_counter() - started)
    return {"first_s": first, "steady_s": statistics.median(steady)}


def run_engine(args: argparse.Namespace, batch: int) -> dict[str, float]:
    from {{ cookiecutter.package_name }}.core import make_plan
    from {{ cookiecutter.package_name }}.generation import Engine, Shape
    from {{ cookiecutter.package_name }}.generation.model import load_model

    config, _ = build(args.size)
    plan = make_plan("auto", 1, "single")
    loaded = load_model(config, plan)
    shape = Shape(batch, (args.prompt_tokens,), args.new_tokens)
    engine = Engine(loaded.model, loaded.tokenizer, plan.strategy, shape)
    started = time.perf_counter()
    engine.warm_up()
    warm = time.perf_counter() - started
    batch_prompts = prompts(batch, args.prompt_tokens)
    result = timed(lambda: engine.generate(batch_prompts), args.rounds)
    return {**result, "warm_up_s": warm}


def run_transformers(args: argparse.Namespace, batch: int, on_device: bool) -> dict[str, float]:
    import torch

    from {{ cookiecutter.package_name }}.core import runtime

    _, model = build(args.size)
    model.eval()
    model.set_attn_implementation("sdpa")
    model.config.use_cache = True
    device = runtime.device() if on_device else torch.device("cpu")
    model = model.to(device)
    ids = torch.tensor(prompts(batch, args.prompt_tokens), device=device)
    options: dict[str, Any] = {"max_new_tokens": args.new_tokens, "min_new_tokens": args.new_tokens}
    options.update(do_sample=False, eos_token_id=None, pad_token_id=0)
    if on_device:
        options["cache_implementation"] = "static"

    def call() -> None:
        with torch.no_grad():
            out = model.generate(ids, **options)
        out.cpu()

    return timed(call, args.rounds)


def worker(args: argparse.Namespace) -> None:
    contender, batch = args.worker.rsplit(":", 1)
    if contender == "engine":
        result = run_engine(args, int(batch))
    else:
        result = run_transformers(args, int(batch), on_device=contender == CONTENDERS[1])
    print(json.dumps(result))


def main() -> None:
    args = parser().parse_args()
    if args.worker:
        worker(args)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for batch in (int(b) for b in args.batches.split(",")):
        for contender in CONTENDERS:
            argv = [sys.executable, __file__, "--worker", f"{contender}:{batch}"]
            argv += ["--size", args.size, "--prompt-tokens", str(args.prompt_tokens)]
            argv += ["--new-tokens", str(args.new_tokens), "--rounds", str(args.rounds)]
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            if done.returncode:
                sys.exit(f"{contender} at batch {batch} failed:\n{done.stderr[-3000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            tokens = batch * args.new_tokens
            rows.append({"contender": contender, "batch": batch, **result,
                         "tokens_per_s": tokens / result["steady_s"]})  # fmt: skip
            print(
                f"{contender}, batch {batch}: {rows[-1]['tokens_per_s']:.1f} tokens/s", flush=True
            )
    lines = [
        "| contender | batch | first call s | steady s | tokens/s | vs transformers (device) "
        "| vs transformers (cpu) | engine warm-up s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        same = {r["contender"]: r for r in rows if r["batch"] == row["batch"]}
        device, cpu = same[CONTENDERS[1]], same[CONTENDERS[2]]
        lines.append(
            f"| {row['contender']} | {row['batch']} | {row['first_s']:.2f} | "
            f"{row['steady_s']:.3f} | {row['tokens_per_s']:.1f} | "
            f"{row['tokens_per_s'] / device['tokens_per_s']:.2f}x | "
            f"{row['tokens_per_s'] / cpu['tokens_per_s']:.2f}x | "
            f"{row.get('warm_up_s', 0):.2f} |"
        )
    (out / "generate_bench.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / "generate_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
