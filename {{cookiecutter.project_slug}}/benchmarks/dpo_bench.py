"""A DPO step against a causal-LM step of twice its batch, on one device: the ratio.

    python benchmarks/dpo_bench.py [--pairs 8] [--length 128] [--steps 30] [--lora]
                                   [--out runs/dpo-bench]

A DPO step runs one forward and backward of `2 x pairs` sequences (a pair's chosen and
rejected, concatenated), and the reference's forward of the same sequences (the adapters
off under `--lora`, else a frozen copy); the causal-LM step it is set against trains
`2 x pairs` sequences of the same length. Both train the same pretrained Llama (dim 512, 8
layers, 8 heads, a byte-level BPE vocabulary of 320 written here; nothing downloaded) with
the same optimizer and precision, each in a process of its own through the project's CLI.
The row is each run's steps/s (from `summary.json`, timed after warm-up) and their ratio,
measured in one run: compare ratios, never seconds across runs.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT / "src"))
sys.path.insert(1, str(PROJECT / "tests"))  # the tests' tokenizer


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8, help="pairs per DPO step")
    parser.add_argument("--length", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lora", action="store_true", help="LoRA: the reference is free")
    parser.add_argument("--out", default="runs/dpo-bench")
    return parser


def make_model(folder: Path) -> tuple[Path, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_helpers import train_tokenizer

    tokenizer = train_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=512, intermediate_size=1408,
        num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
        max_position_embeddings=1024, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, tokenizer


def write_pairs(path: Path, count: int, length: int, tokenizer: Any) -> Path:
    """Pairs whose prompt is a quarter of `length` tokens and whose completions fill the
    rest (a longer one is cut at `max_length`, as DPO cuts it)."""
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]

    def text(tokens: int) -> str:
        made = ""
        while len(tokenizer(made)["input_ids"]) < tokens:
            made += " " + rng.choice(words)
        return made

    rows = []
    for index in range(count):
        prompt = f"{index}:{text(length // 4)}"
        rest = length - len(tokenizer(prompt)["input_ids"])
        rows.append({"prompt": prompt, "chosen": text(rest), "rejected": text(rest)})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def run(out: Path, name: str, sets: dict[str, object], steps: int) -> dict[str, float]:
    run_dir = out / name
    words = [w for key, value in sets.items() for w in ("--set", f"{key}={value}")]
    command = [
        sys.executable, "-m", "{{ cookiecutter.package_name }}", "train", *words,
        "--max-steps", str(steps), "--log-every", str(steps), "--eval-every", "0",
        "--set", "checkpoint_every=0", "--run-dir", str(run_dir), "--devices", "1",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{name}: {done.stderr.strip().splitlines()[-1]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"steps_per_s": summary["steps_per_second"],
            "first_step_s": summary["time_to_first_step_s"]}  # fmt: skip


def main() -> None:
    args = parser().parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer = make_model(out / "model")
    pairs = write_pairs(out / "pairs.jsonl", max(64, 4 * args.pairs), args.length, tokenizer)
    common: dict[str, object] = {
        "task": "hf-causal-lm", "task_options.model_name": str(model), "optimizer": "adamw",
        "precision": "32-true", "warmup_steps": 0,
    }  # fmt: skip
    if args.lora:
        common.update({"lora.rank": 16, "lora.alpha": 32})
    dpo = run(out, "dpo", {**common, "objective": "dpo", "dpo.data": str(pairs),
                           "dpo.max_length": args.length, "dpo.eval_fraction": 0.0,
                           "batch_size": args.pairs}, args.steps)  # fmt: skip
    lm = run(out, "causal-lm", {**common, "task_options.seq_len": args.length,
                                "batch_size": 2 * args.pairs}, args.steps)  # fmt: skip
    ratio = lm["steps_per_s"] / dpo["steps_per_s"]
    reference = "adapters off (LoRA)" if args.lora else "frozen copy"
    lines = [
        "| step | sequences x tokens | steps/s | first step (s) |",
        "|---|---|---|---|",
        f"| DPO, reference {reference} | {2 * args.pairs} x {args.length} | "
        f"{dpo['steps_per_s']:.3f} | {dpo['first_step_s']:.1f} |",
        f"| causal LM | {2 * args.pairs} x {args.length} | {lm['steps_per_s']:.3f} | "
        f"{lm['first_step_s']:.1f} |",
        "",
        f"A DPO step takes {ratio:.2f}x the causal-LM step of twice its batch.",
    ]
    text = "\n".join(lines)
    print(text)
    (out / "dpo-bench.md").write_text(text + "\n")
    (out / "dpo-bench.json").write_text(json.dumps({"dpo": dpo, "causal_lm": lm, "ratio": ratio}))


if __name__ == "__main__":
    main()
