"""Steps/s of the training loop beside a hand-written torch_xla loop and Accelerate, on XLA:CPU.

    python benchmarks/bench.py [--workloads mlp,task,spmd,fsdp,ckpt,wandb,hf-llama,hf-moe]
                               [--rounds 5] [--out runs/bench] [--profile]

Workloads: an MLP on one device, the example task on one device, the MLP data parallel
on 8 SPMD devices, the example task under FSDP on 8 devices (its hand-written
contender is an FSDPv2 loop as torch_xla documents it), and a Hugging Face Llama and
Mixtral (a mixture of experts) on one device (skipped where transformers is not
installed); "vs reference" is the ratio to
the hand-written loop. The ckpt workload runs the training loop on the example task
without saves (its reference), then saving every 10 steps synchronously, then in the
background (async_checkpoint). The wandb workload runs it without and with a W&B run
(offline) beside TensorBoard: steps/s, host ms/step and transfers. Every contender trains the
same model on the same data with the same batch size, precision (fp32), device and
math (AdamW, warm-up + cosine schedule, gradient clipping at 1.0, the loss read every
20 steps). Within one workload all contenders run
in one process, in turn, for several rounds; the first 3 steps of every run (where
graphs compile) are not timed. XLA health (graphs compiled, CPU fallback ops,
device-to-host transfers) is read from a cold run of each contender in a fresh process,
since XLA's graph cache is shared within a process. `--profile` adds where each
contender's host time goes per step, side by side (profiling.py), to profile.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from {{ cookiecutter.package_name }}.core import make_plan
from {{ cookiecutter.package_name }}.core.launcher import launch
from {{ cookiecutter.package_name }}.core.layers import block_class_of
from {{ cookiecutter.package_name }}.tasks import load_task
from {{ cookiecutter.package_name }}.training import TrainConfig, fit

from contenders import CONTENDERS
from profiling import per_step, report
from report import MODEL_KEYS, depth_table, table, verdict
from workloads import (
    CONFIG,
    DEPTH_STEPS,
    DEPTHS,
    STRATEGY,
    WORKLOADS,
    log_reads,
    make_workload,
    skip_reason,
)


def worker(
    workload: str, contenders: list[str], rounds: int, profile: bool = False
) -> dict[str, Any]:
    """Run each contender in turn, `rounds` times, in this process (or profile each)."""
    total, _, devices, _ = WORKLOADS[workload]
    task = make_workload(workload)
    if profile:
        return {
            name: per_step(
                lambda steps, run=CONTENDERS[name]: run(task, steps, devices, workload), total
            )
            for name in contenders
        }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name in contenders:
            runs[name].append(CONTENDERS[name](task, total, devices, workload))
    return runs


def run_worker(
    workload: str, contenders: list[str], rounds: int, profile: bool = False
) -> dict[str, Any]:
    """Run `worker` in a fresh process (SPMD and device counts are per process)."""
    devices = WORKLOADS[workload][2]
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    if devices > 1:
        env["CPU_NUM_DEVICES"] = str(devices)
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, __file__, "--worker", workload, "--result", out.name]
        command += ["--contenders", ",".join(contenders), "--rounds", str(rounds)]
        command += ["--profile"] if profile else []
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"benchmark worker {workload} failed:\n{done.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(Path(out.name).read_text())
        return result


def measure(workload: str, rounds: int | None) -> list[dict[str, Any]]:
    """Median steps/s of each contender (one process), and its health from a cold process."""
    reason = skip_reason(workload)
    if reason is not None:
        return [{"workload": workload, "skipped": reason}]
    total, default_rounds, _, contenders = WORKLOADS[workload]
    timed = run_worker(workload, list(contenders), rounds or default_rounds)
    rows: list[dict[str, Any]] = []
    for name in contenders:
        cold = run_worker(workload, [name], 1)[name][0]
        rates = [run["rate"] for run in timed[name]]
        host = [run["host_ms"] for run in timed[name]]
        rows.append(
            {
                "workload": workload,
                "contender": name,
                "steps_per_run": total,
                "rounds": rates,
                "median": statistics.median(rates),
                "host_ms": statistics.median(host),
                "compilations": cold["compilations"],
                "first_step": cold["first_step"],
                "eval_graphs": cold.get("eval_graphs"),
                "fallback_ops": cold["fallback_ops"],
                "transfers_per_step": cold["transfers"] / total,
                "outside_logging_per_step": (cold["transfers"] - log_reads(total)) / total,
                "model": {k: cold[k] for k in MODEL_KEYS if k in cold},  # the trainer's count
            }
        )
    for row in rows:
        row["vs_reference"] = row["median"] / rows[0]["median"]
    return rows


def depth_run(layers: int, scan: bool) -> dict[str, Any]:
    """A short cold run of the example task with `layers` blocks (worker process)."""
    with tempfile.TemporaryDirectory() as run_dir:
        task = load_task(CONFIG.task, options={"layers": layers})
        config = TrainConfig(
            task=CONFIG.task, accelerator="cpu", devices="1", strategy="single",
            max_steps=DEPTH_STEPS, log_every=1, scan_layers=scan, run_dir=run_dir,
            task_options={"layers": layers},
        )  # fmt: skip
        summary = fit(config, make_plan("cpu", 1, "single"), task=task)
    return {
        "blocks": layers,
        "scanned": scan,
        "first_step": summary["time_to_first_step_s"],
        "compile": summary["first_step_compile_s"],
        "rate": summary["steps_per_second"],
        "graphs": summary["loop_compilations"],
        "losses": [loss for _, loss in summary["train_losses"]],
    }


def depth_sweep(depths: list[int]) -> list[dict[str, Any]]:
    """Time to first step and steps/s by depth, unrolled and scanned, each in a cold process."""
    rows = []
    for layers in depths:
        for scan in (False, True):
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                command = [sys.executable, __file__, "--depth-worker", f"{layers},{int(scan)}"]
                env = {**os.environ, "PJRT_DEVICE": "CPU"}
                src = str(Path(__file__).resolve().parents[1] / "src")
                env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
                done = subprocess.run(
                    [*command, "--result", out.name], env=env, capture_output=True, text=True,
                    check=False,
                )  # fmt: skip
                if done.returncode != 0:
                    raise SystemExit(f"depth worker {layers} failed:\n{done.stderr[-3000:]}")
                rows.append(json.loads(Path(out.name).read_text()))
    return rows


def parser() -> argparse.ArgumentParser:
    """The command line this script takes (the docs' commands are checked against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=None, help="override rounds per workload")
    parser.add_argument("--out", default="runs/bench")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--contenders", help=argparse.SUPPRESS)
    parser.add_argument("--depths", default=DEPTHS, help="blocks of the depth sweep ('' skips)")
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument(
        "--profile", action="store_true", help="also profile each contender's steps (profile.md)"
    )
    parser.add_argument("--depth-worker", help=argparse.SUPPRESS)
    return parser


def main() -> int:
    args = parser().parse_args()
    if args.depth_worker:
        layers, scan = (int(part) for part in args.depth_worker.split(","))
        Path(args.result).write_text(json.dumps(depth_run(layers, bool(scan))))
        return 0
    if args.worker:
        if args.worker in STRATEGY:  # SPMD is process-wide: on for every contender
            plan = make_plan("cpu", WORKLOADS[args.worker][2], "spmd")
            work = (args.worker, args.contenders.split(","), args.rounds, args.profile)
            runs = launch(worker, plan, args=work)
        else:
            runs = worker(args.worker, args.contenders.split(","), args.rounds, args.profile)
        Path(args.result).write_text(json.dumps(runs))
        return 0
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        print(f"unknown workload {unknown[0]!r}: choose from {', '.join(WORKLOADS)}")
        return 2
    rows = [row for workload in workloads for row in measure(workload, args.rounds)]
    depths = [int(d) for d in args.depths.split(",") if d.strip()]
    scannable = block_class_of(load_task(CONFIG.task).build_model()) is not None
    sweep = depth_sweep(depths) if depths and scannable else []
    sweep_text = (
        depth_table(sweep)
        if sweep
        else f"Depth sweep: skipped ({'no depths' if not depths else 'no BlockStack to scan'})."
    )
    text = "\n".join(
        [
            f"XLA:CPU, fp32, {os.cpu_count()} host cores (shared: expect noise; medians).",
            "",
            table(rows, f"{CONFIG.task} example"),
            "",
            *verdict(rows),
            "",
            sweep_text,
        ]
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.md").write_text(text + "\n")
    (out / "bench.json").write_text(json.dumps({"rows": rows, "depths": sweep}, indent=2) + "\n")
    print(text)
    print(f"\nwritten: {out / 'bench.md'} and {out / 'bench.json'}")
    if args.profile:
        profiled = [
            report(w, run_worker(w, list(WORKLOADS[w][3]), 1, profile=True))
            for w in workloads
            if skip_reason(w) is None
        ]
        (out / "profile.md").write_text("\n\n".join(profiled) + "\n")
        print("\n\n".join(profiled))
        print(f"\nwritten: {out / 'profile.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
