"""Long sequences over a `context` axis on XLA:CPU: losses, graphs and activations per device.

    python benchmarks/long_bench.py [--seq-len 2048] [--steps 6] [--out runs/long-bench]

Prepares a corpus of short documents (a window of `--seq-len` tokens holds dozens), then
trains the example task on it, each run its own process: on one device, and on 4 and 8
emulated devices with the sequence split over `context` (`context=4`, `context=8`,
`context=4,fsdp=2`), the same global batch of 2 sequences, documents masked. For each run:
its losses against one device's (largest relative difference), the graphs compiled in the
loop, whether the step was replayed, the activation bytes per device `plan` counts for that
mesh, and the largest temporary buffer XLA's buffer assignment gives one device's compiled
program (XLA:CPU reports no device memory; its compiler's plan for a device's buffers is
the measure here). Not a test: timings move with whatever else the machine runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[1]
PACKAGE = "{{ cookiecutter.package_name }}"
CONFIG = PROJECT / "configs" / "{{ cookiecutter.example_task }}.toml"
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
# name -> (devices, strategy, mesh, accelerator plan counts for, batch size per context group)
MESHES: dict[str, tuple[int, str, str, str, int]] = {
    "one device": (1, "spmd", "", "v5litepod-1", 2),
    "context=4": (4, "spmd", "context=4", "v5litepod-4", 2),
    "context=8": (8, "spmd", "context=8", "v5litepod-8", 2),
    "context=4,fsdp=2": (8, "fsdp", "context=4,fsdp=2", "v5litepod-8", 1),
}
TEMPORARY = re.compile(r"allocation \d+: size (\d+), preallocated-temp")


def corpus(path: Path, documents: int) -> Path:
    """JSON lines of a few words each: many documents to a window."""
    rng = random.Random(0)
    lines = []
    for _ in range(documents):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) + "."
        lines.append(json.dumps({"text": text}) + "\n")
    path.write_text("".join(lines))
    return path


def run(command: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")


def largest_temporary(dump: Path) -> int:
    """The largest temporary buffer of any program XLA compiled for one device."""
    sizes = [int(size) for path in dump.glob("*buffer-assignment.txt")
             for size in TEMPORARY.findall(path.read_text())]  # fmt: skip
    return max(sizes)


def planned(sets: list[str], mesh: str, accelerator: str) -> dict[str, Any]:
    """`plan --json` for the run's model and batch on `mesh`."""
    command = [sys.executable, "-m", PACKAGE, "plan", "--config", str(CONFIG), *sets,
               "--accelerator-type", accelerator, "--mesh", mesh or "fsdp=1",
               "--global-batch", "2", "--json"]  # fmt: skip
    done = subprocess.run(command, env=environment(), capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"plan failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout))


def environment(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(PROJECT / "src"), "PJRT_DEVICE": "CPU", **extra}


def parser() -> argparse.ArgumentParser:
    """The command line this script takes (the docs' commands are checked against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", type=Path, default=Path("runs/long-bench"))
    parser.add_argument(
        "--model", nargs="*", default=["dim=32", "layers=1", "heads=8"],
        help="task_options of the model (its heads divide by 8: the flash layout's rule)",
    )  # fmt: skip
    return parser


def main() -> None:
    args = parser().parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sets = ["--set", f"task_options.seq_len={args.seq_len}"]
    sets += [item for pair in args.model for item in ("--set", f"task_options.{pair}")]
    cli = [sys.executable, "-m", PACKAGE]
    data = args.out / "prepared"
    if not (data / "prepared.json").exists():
        source = corpus(args.out / "documents.jsonl", args.seq_len * 2 * (args.steps + 2) // 30)
        run([*cli, "prepare", str(source), "--out", str(data), "--config", str(CONFIG),
             "--eval-fraction", "0.1", *sets], environment())  # fmt: skip
    rows: dict[str, dict[str, Any]] = {}
    for name, (devices, strategy, mesh, accelerator, batch) in MESHES.items():
        folder = args.out / re.sub(r"\W+", "-", name)
        dump = folder / "xla"
        run([*cli, "train", "--config", str(CONFIG), *sets, "--data", str(data),
             "--devices", str(devices), "--strategy", strategy, *(["--mesh", mesh] if mesh else []),
             "--batch-size", str(batch), "--max-steps", str(args.steps), "--log-every", "1",
             "--eval-every", "0", "--set", "eval_batch_size=1", "--set", "accelerator=cpu",
             "--run-dir", str(folder / "run")],
            environment(XLA_FLAGS=f"--xla_dump_to={dump}"))  # fmt: skip
        summary = json.loads((folder / "run" / "summary.json").read_text())
        plan = planned(sets, mesh, accelerator)
        rows[name] = {
            "losses": [loss for _, loss in summary["train_losses"]],
            "loop_compilations": summary["loop_compilations"],
            "replayed": summary["step"]["replayed"],
            "host_ms_per_step": summary["host_ms_per_step"],
            "planned_activations": plan["per_device"]["activation_bytes"],
            "xla_largest_temporary": largest_temporary(dump),
        }
    reference = rows["one device"]["losses"]
    for row in rows.values():
        pairs = zip(row["losses"], reference, strict=True)
        row["loss_rel_diff"] = max(abs(a - b) / abs(b) for a, b in pairs)
    (args.out / "long-bench.json").write_text(json.dumps(rows, indent=2))
    print(f"seq_len {args.seq_len}, global batch 2, {args.steps} steps, documents masked")
    print("| mesh | losses vs one device | graphs | replayed | plan: activations/device "
          "| XLA: largest temporary | host ms/step |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, row in rows.items():
        mib = row["planned_activations"] / 2**20, row["xla_largest_temporary"] / 2**20
        print(f"| {name} | {row['loss_rel_diff']:.1e} | {row['loop_compilations']} "
              f"| {row['replayed']} | {mib[0]:.1f} MiB | {mib[1]:.1f} MiB "
              f"| {row['host_ms_per_step']} |")  # fmt: skip


if __name__ == "__main__":
    main()
