"""Steps/s of the training loop beside a hand-written torch_xla loop and Accelerate, on XLA:CPU.

    python benchmarks/bench.py [--workloads mlp,task,spmd,fsdp] [--rounds 5] [--out runs/bench]

Workloads: an MLP on one device, the example task on one device, the MLP data parallel
on 8 SPMD devices, and the example task under FSDP on 8 devices (its hand-written
contender is an FSDPv2 loop as torch_xla documents it); "vs reference" is the ratio to
the hand-written loop. The ckpt workload runs the training loop on the example task
without saves (its reference), then saving every 10 steps synchronously, then in the
background (async_checkpoint). Every contender trains the
same model on the same data with the same batch size, precision (fp32), device and
math (AdamW, warm-up + cosine schedule, gradient clipping at 1.0, the loss read every
20 steps). Within one workload all contenders run
in one process, in turn, for several rounds; the first 3 steps of every run (where
graphs compile) are not timed. XLA health (graphs compiled, CPU fallback ops,
device-to-host transfers) is read from a cold run of each contender in a fresh process,
since XLA's graph cache is shared within a process.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from {{ cookiecutter.package_name }}.core import health, make_plan, move_to_device
from {{ cookiecutter.package_name }}.core.launcher import launch
from {{ cookiecutter.package_name }}.core.layers import block_class_of
from {{ cookiecutter.package_name }}.tasks import load_task
from {{ cookiecutter.package_name }}.training import TrainConfig, fit
from {{ cookiecutter.package_name }}.training.optim import lr_lambda

WARMUP_STEPS = 3  # the training loop's own timer also starts after step 3
LOG_EVERY = 20
CONFIG = TrainConfig()  # the defaults every contender copies
WORKLOADS = {
    # name: (steps per run, rounds, devices, contenders)
    "mlp": (128, 5, 1, ("hand-written", "trainer", "accelerate")),
    "task": (43, 3, 1, ("hand-written", "trainer", "accelerate")),
    "spmd": (64, 3, 8, ("hand-written", "trainer")),
    "fsdp": (32, 3, 8, ("hand-written", "trainer")),
    "ckpt": (60, 3, 1, ("trainer", "trainer+sync saves", "trainer+async saves")),
}
CHECKPOINT_EVERY = 10  # the ckpt workload: steps/s while saving this often
STRATEGY = {"spmd": "spmd", "fsdp": "fsdp"}  # workload -> strategy; the rest: one device
FSDP_BATCH = 4  # per device: the task's global batch of 32 over 8 devices


class Pairs(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "y": self.y[index]}


class MlpTask:
    """An MLP 64-256-10 on synthetic data: 4096 samples, 32 steps of 128 per epoch."""

    name = "mlp"
    batch_size = 128

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(5120, 64, generator=generator)
        self.y = torch.randint(0, 10, (5120,), generator=generator)

    def build_model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))

    def train_dataset(self) -> Pairs:
        return Pairs(self.x[:4096], self.y[:4096])

    def eval_dataset(self) -> Pairs:
        return Pairs(self.x[4096:], self.y[4096:])

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(model(batch["x"]), batch["y"])

    def metrics(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"loss": F.cross_entropy(model(batch["x"]), batch["y"], reduction="none")}


def make_workload(name: str) -> Any:
    if name in ("mlp", "spmd"):
        return MlpTask()
    task = load_task(CONFIG.task)
    task.batch_size = FSDP_BATCH if name == "fsdp" else CONFIG.batch_size
    return task


def log_reads(steps: int) -> int:
    """Loss reads at the logging cadence, the last step included (as the training loop logs)."""
    return steps // LOG_EVERY + (1 if steps % LOG_EVERY else 0)


class Clock:
    """Starts after the warm-up steps with the device idle; stops when it is idle again.

    It also reads XLA's counters over the whole loop, warm-up included.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.start = 0.0
        self.began = time.perf_counter()
        self.first_step = 0.0
        self.health = health.snapshot()

    def step(self, step: int) -> None:
        if step == 1:  # compiled and ran: the time to the first step
            import torch_xla
            import torch_xla.core.xla_model as xm

            torch_xla.sync()
            xm.wait_device_ops()
            self.first_step = time.perf_counter() - self.began
        if step == WARMUP_STEPS:
            import torch_xla
            import torch_xla.core.xla_model as xm

            torch_xla.sync()
            xm.wait_device_ops()
            self.start = time.perf_counter()

    def result(self) -> dict[str, Any]:
        import torch_xla.core.xla_model as xm

        xm.wait_device_ops()
        rate = (self.total - WARMUP_STEPS) / (time.perf_counter() - self.start)
        delta = health.snapshot().since(self.health)
        return {"rate": rate, "first_step": self.first_step, **delta.__dict__}


def optimizer_and_schedule(model: nn.Module, total: int) -> tuple[Any, Any]:
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=CONFIG.lr, weight_decay=CONFIG.weight_decay
    )
    schedule = lr_lambda(CONFIG.schedule, CONFIG.warmup_steps, total)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def hand_written(task: Any, total: int, devices: int, workload: str) -> dict[str, Any]:
    """The loop of torch_xla's examples: MpDeviceLoader, an optimizer step, step closures.

    Data parallel on one device or over an SPMD `data` axis; for the fsdp workload,
    FSDPv2 as its documentation writes it: each block wrapped, the batch sharded.
    """
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.parallel_loader as pl

    device = torch_xla.device()
    torch.manual_seed(CONFIG.seed)
    axis = "fsdp" if workload == "fsdp" else "data"
    mesh = spmd_mesh(devices, axis) if devices > 1 else None
    if workload == "fsdp":
        model = fsdpv2(move_to_device(task.build_model(), device), task, mesh)  # ties kept
    else:
        model = task.build_model().to(device)
    optimizer, scheduler = optimizer_and_schedule(model, total)
    loader = DataLoader(
        task.train_dataset(), batch_size=task.batch_size * devices, shuffle=True, drop_last=True
    )
    sharding = None
    if mesh is not None:
        import torch_xla.distributed.spmd as xs

        sample = next(iter(loader))
        sharding = {
            k: xs.ShardingSpec(mesh, (axis,) + (None,) * (v.dim() - 1)) for k, v in sample.items()
        }
    losses: list[float] = []
    clock, step = Clock(total), 0
    while step < total:
        for batch in pl.MpDeviceLoader(loader, device, input_sharding=sharding):
            optimizer.zero_grad()
            loss = task.loss(model, batch)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), CONFIG.grad_clip)
            xm.optimizer_step(optimizer)  # under SPMD the compiler inserts the reductions
            scheduler.step()
            step += 1
            if step % LOG_EVERY == 0 or step == total:
                xm.add_step_closure(lambda value: losses.append(value.item()), args=(loss,))
            clock.step(step)
            if step == total:
                break
    torch_xla.sync()
    return clock.result()


def spmd_mesh(devices: int, axis: str) -> Any:
    import numpy as np
    import torch_xla.distributed.spmd as xs

    return xs.Mesh(np.arange(devices), (devices,), (axis,))


def fsdpv2(model: nn.Module, task: Any, mesh: Any) -> nn.Module:
    """The model in FSDPv2, each of the task's blocks wrapped on its own."""
    import functools

    from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import (
        SpmdFullyShardedDataParallel as FSDPv2,
    )

    block = getattr(task, "block_class", None)
    policy = block and functools.partial(
        transformer_auto_wrap_policy, transformer_layer_cls={block}
    )
    return FSDPv2(model, mesh=mesh, auto_wrap_policy=policy)


def accelerate_loop(task: Any, total: int, devices: int, workload: str) -> dict[str, Any]:
    """Accelerate's loop; the loss is read one step late, after the loader's sync."""
    from accelerate import Accelerator

    accelerator = Accelerator()
    torch.manual_seed(CONFIG.seed)
    model = task.build_model()
    optimizer, scheduler = optimizer_and_schedule(model, total)
    loader = DataLoader(
        task.train_dataset(), batch_size=task.batch_size, shuffle=True, drop_last=True
    )
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    losses: list[float] = []
    pending: torch.Tensor | None = None
    clock, step = Clock(total), 0
    while step < total:
        for batch in loader:
            if pending is not None:  # already computed: a transfer, not a new graph
                losses.append(pending.item())
                pending = None
            loss = task.loss(model, batch)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), CONFIG.grad_clip)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            if step % LOG_EVERY == 0 or step == total:
                pending = loss.detach()
            clock.step(step)
            if step == total:
                break
    import torch_xla

    torch_xla.sync()
    if pending is not None:
        losses.append(pending.item())
    return clock.result()


def trainer(task: Any, total: int, devices: int, workload: str, saves: str = "") -> dict[str, Any]:
    """The training loop through its public API, default features on, eval off.

    `saves` ("sync" or "async") checkpoints every CHECKPOINT_EVERY steps.
    """
    strategy = STRATEGY.get(workload, "single")
    with tempfile.TemporaryDirectory() as run_dir:
        config = TrainConfig(
            checkpoint_every=CHECKPOINT_EVERY if saves else 0,
            async_checkpoint=saves == "async",
            task=task.name,
            accelerator="cpu",
            devices=str(devices),
            strategy=strategy,
            precision="32-true",
            batch_size=task.batch_size,
            max_steps=total,
            log_every=LOG_EVERY,
            run_dir=run_dir,
        )
        summary = fit(config, make_plan("cpu", devices, strategy), task=task)
    # Its timer starts after step 3 too; its loop counters exclude the final eval and save.
    return {
        "rate": float(summary["steps_per_second"]),
        "compilations": summary["loop_compilations"],
        "transfers": summary["loop_transfers"],
        "fallback_ops": summary["fallback_ops"],
        "eval_graphs": summary["compilations"] - summary["loop_compilations"],
        "first_step": summary["time_to_first_step_s"],
    }


CONTENDERS: dict[str, Callable[[Any, int, int, str], dict[str, Any]]] = {
    "hand-written": hand_written,
    "trainer": trainer,
    "accelerate": accelerate_loop,
    "trainer+sync saves": functools.partial(trainer, saves="sync"),
    "trainer+async saves": functools.partial(trainer, saves="async"),
}


def worker(workload: str, contenders: list[str], rounds: int) -> dict[str, Any]:
    """Run each contender in turn, `rounds` times, in this process."""
    total, _, devices, _ = WORKLOADS[workload]
    task = make_workload(workload)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name in contenders:
            runs[name].append(CONTENDERS[name](task, total, devices, workload))
    return runs


def run_worker(workload: str, contenders: list[str], rounds: int) -> dict[str, Any]:
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
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"benchmark worker {workload} failed:\n{done.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(Path(out.name).read_text())
        return result


def measure(workload: str, rounds: int | None) -> list[dict[str, Any]]:
    """Median steps/s of each contender (one process), and its health from a cold process."""
    total, default_rounds, _, contenders = WORKLOADS[workload]
    timed = run_worker(workload, list(contenders), rounds or default_rounds)
    rows: list[dict[str, Any]] = []
    for name in contenders:
        cold = run_worker(workload, [name], 1)[name][0]
        rates = [run["rate"] for run in timed[name]]
        rows.append(
            {
                "workload": workload,
                "contender": name,
                "steps_per_run": total,
                "rounds": rates,
                "median": statistics.median(rates),
                "compilations": cold["compilations"],
                "first_step": cold["first_step"],
                "eval_graphs": cold.get("eval_graphs"),
                "fallback_ops": cold["fallback_ops"],
                "transfers_per_step": cold["transfers"] / total,
                "outside_logging_per_step": (cold["transfers"] - log_reads(total)) / total,
            }
        )
    for row in rows:
        row["vs_reference"] = row["median"] / rows[0]["median"]
    return rows


def table(rows: list[dict[str, Any]], task_name: str) -> str:
    lines = [
        "| workload | contender | steps/s (median) | rounds | vs reference | first step (s) "
        "| graphs | fallback ops | transfers/step | outside logging |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    names = {
        "task": task_name,
        "spmd": "spmd mlp x8",
        "fsdp": f"fsdp {task_name} x8",
        "ckpt": f"{task_name}, saving every {CHECKPOINT_EVERY} steps",
    }
    by_workload: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_workload.setdefault(row["workload"], []).append(row)
    for workload, group in by_workload.items():
        label = names.get(workload, workload)
        for row in group:
            rounds = " ".join(f"{rate:.0f}" for rate in row["rounds"])
            graphs = str(row["compilations"])
            if row["eval_graphs"] is not None:
                graphs += f" (+{row['eval_graphs']} eval)"
            ops = ", ".join(f"{k} x{v}" for k, v in row["fallback_ops"].items()) or "0"
            lines.append(
                f"| {label} | {row['contender']} | {row['median']:.1f} | {rounds} "
                f"| {row['vs_reference']:.2f}x | {row['first_step']:.1f} | {graphs} | {ops} "
                f"| {row['transfers_per_step']:.3f} | {row['outside_logging_per_step']:.3f} |"
            )
        if workload != "ckpt" and all(row["contender"] != "accelerate" for row in group):
            lines.append(
                f"| {label} | accelerate | n/a | | | | | | | |"
                if workload not in STRATEGY
                else f"| {label} | accelerate | n/a: no XLA:CPU SPMD path | | | | | | | |"
            )
    return "\n".join(lines)


def verdict(rows: list[dict[str, Any]]) -> list[str]:
    """The targets, met or missed, per workload."""
    notes = []
    for workload in dict.fromkeys(row["workload"] for row in rows):
        group = {row["contender"]: row for row in rows if row["workload"] == workload}
        if "hand-written" not in group:
            continue  # a comparison of the loop with itself: no target
        ours = group["trainer"]
        checks = [
            (
                f"trainer {ours['vs_reference']:.2f}x hand-written (target >= 0.98x)",
                ours["vs_reference"] >= 0.98,
            ),
            (
                f"trainer graphs: {ours['compilations']} train + {ours['eval_graphs']} eval "
                "(target 1 + 1)",
                ours["compilations"] == 1 and ours["eval_graphs"] == 1,
            ),
            ("trainer fallback ops: none", not ours["fallback_ops"]),
            (
                f"trainer transfers outside logging: {ours['outside_logging_per_step']:.3f}/step",
                ours["outside_logging_per_step"] <= 0,
            ),
        ]
        if "accelerate" in group:
            ratio = ours["median"] / group["accelerate"]["median"]
            checks.append((f"trainer {ratio:.2f}x Accelerate (target >= 1.2x)", ratio >= 1.2))
        for text, met in checks:
            notes.append(f"- {workload}: {'met' if met else 'MISSED'}: {text}")
    return notes


DEPTHS = "2,8,24"  # blocks of the depth sweep
DEPTH_STEPS = 8


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


def depth_table(rows: list[dict[str, Any]]) -> str:
    """The sweep as a table, and the scanned deepest model against the shallowest."""
    by = {(row["blocks"], row["scanned"]): row for row in rows}
    lines = [
        f"Depth sweep ({CONFIG.task} example, one device, {DEPTH_STEPS} steps, cold process each):",
        "",
        "| blocks | first step unrolled (s) | first step scanned (s) | compile unrolled (s) "
        "| compile scanned (s) | steps/s unrolled | steps/s scanned | graphs | losses equal |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for blocks in sorted({row["blocks"] for row in rows}):
        plain, scan = by[(blocks, False)], by[(blocks, True)]
        same = all(
            abs(a - b) <= 1e-5 * abs(b)
            for a, b in zip(scan["losses"], plain["losses"], strict=True)
        )
        lines.append(
            f"| {blocks} | {plain['first_step']:.1f} | {scan['first_step']:.1f} "
            f"| {plain['compile']:.1f} | {scan['compile']:.1f} | {plain['rate']:.1f} "
            f"| {scan['rate']:.1f} | {plain['graphs']} / {scan['graphs']} "
            f"| {'yes' if same else 'NO'} |"
        )
    shallow, deep = min(by)[0], max(by)[0]
    ratio = by[(deep, True)]["first_step"] / by[(shallow, False)]["first_step"]
    lines += [
        "",
        f"- scanned {deep} blocks: first step {ratio:.2f}x the unrolled {shallow}-block one "
        f"(target <= 1.5x): {'met' if ratio <= 1.5 else 'MISSED'}",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=None, help="override rounds per workload")
    parser.add_argument("--out", default="runs/bench")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--contenders", help=argparse.SUPPRESS)
    parser.add_argument("--depths", default=DEPTHS, help="blocks of the depth sweep ('' skips)")
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--depth-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.depth_worker:
        layers, scan = (int(part) for part in args.depth_worker.split(","))
        Path(args.result).write_text(json.dumps(depth_run(layers, bool(scan))))
        return 0
    if args.worker:
        if args.worker in STRATEGY:  # SPMD is process-wide: on for every contender
            plan = make_plan("cpu", WORKLOADS[args.worker][2], "spmd")
            runs = launch(worker, plan, args=(args.worker, args.contenders.split(","), args.rounds))
        else:
            runs = worker(args.worker, args.contenders.split(","), args.rounds)
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
