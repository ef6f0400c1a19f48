"""Steps/s of the training loop beside a hand-written FSDP2 + torch.compile loop (torch_tpu).

    python benchmarks/bench.py [--devices 2] [--steps 60] [--rounds 3] [--out runs/bench]

One workload, the example task under fsdp on `--devices` processes (CPU processes over
gloo off a TPU), two contenders on the same model, mesh, batch, precision (fp32), AdamW
and gradient clipping at 1.0, each step compiled by torch.compile with the same backend
(`aot_eager` on the CPU): the hand-written loop, as PyTorch's FSDP2 tutorial writes it
(`fully_shard` per block and on the model, one compiled function of forward, backward,
clip and update, a constant learning rate, the loss read every 20 steps), and the
training loop (`fit`: its schedule, data sharding, logging every 20 steps, the step
guard's bookkeeping). The first 3 steps of every run (where graphs compile) are not timed;
the contenders take turns for `--rounds` rounds and the median counts. "vs reference" is
the trainer's steps/s over the hand-written loop's: the target is at least 1.0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from {{ cookiecutter.package_name }}.core import make_plan, runtime
from {{ cookiecutter.package_name }}.core.launcher import launch
from {{ cookiecutter.package_name }}.core.replay import compile_backend
from {{ cookiecutter.package_name }}.core.tying import move_to_device
from {{ cookiecutter.package_name }}.tasks import block_class, load_task
from {{ cookiecutter.package_name }}.training import TrainConfig, fit

WARM_UP = 3
LOG_EVERY = 20
TASK_OPTIONS = {"seq_len": 64, "dim": 128, "layers": 2, "heads": 4, "max_bytes": 400_000}


def config(devices: int, steps: int, run_dir: str) -> TrainConfig:
    """The run both contenders make: the example task, fsdp over `devices` processes."""
    return TrainConfig(
        task="{{ cookiecutter.example_task }}",
        accelerator="cpu",
        devices=str(devices),
        strategy="fsdp",
        precision="32-true",
        max_steps=steps,
        batch_size=8,
        log_every=LOG_EVERY,
        eval_every=0,
        checkpoint_every=0,
        goodput="off",
        run_dir=run_dir,
        task_options=dict(TASK_OPTIONS) if "{{ cookiecutter.example_task }}" == "lm" else {},
    )


def hand_written(cfg: TrainConfig) -> dict[str, float]:
    """The FSDP2 + torch.compile loop, in each process; process 0's steps/s."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.utils.data import DataLoader, DistributedSampler

    device = runtime.device()
    task = load_task(cfg.task, cfg.data, cfg.task_options)
    torch.manual_seed(cfg.seed)
    model = move_to_device(task.build_model(), device)  # tied weights kept tied
    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("fsdp",))
    blocks = block_class(task, model)
    for module in [m for m in model.modules() if blocks and isinstance(m, blocks)]:
        fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    dataset = task.train_dataset()
    sampler = DistributedSampler(dataset, shuffle=True, seed=cfg.seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler, drop_last=True)

    @torch.compile(backend=compile_backend(), dynamic=False)
    def step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        loss = task.loss(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    done, started, epoch = 0, 0.0, 0
    while done < cfg.max_steps:
        sampler.set_epoch(epoch)
        for batch in loader:
            loss = step({key: value.to(device) for key, value in batch.items()})
            done += 1
            if done % LOG_EVERY == 0:
                float(loss.item())
            if done == WARM_UP:
                started = time.perf_counter()
            if done >= cfg.max_steps:
                break
        epoch += 1
    return {"steps_per_second": (done - WARM_UP) / (time.perf_counter() - started)}


def run(contender: str, devices: int, steps: int) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        cfg = config(devices, steps, scratch)
        plan = make_plan("cpu", devices, "fsdp")
        if contender == "hand-written":
            result = launch(hand_written, plan, args=(cfg,))
        else:
            result = launch(fit, plan, args=(cfg, plan))
    return float(result["steps_per_second"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("runs/bench"))
    args = parser.parse_args()
    runtime.configure("cpu")
    timings: dict[str, list[float]] = {"hand-written": [], "trainer": []}
    for _ in range(args.rounds):
        for contender in timings:
            timings[contender].append(run(contender, args.devices, args.steps))
    reference = statistics.median(timings["hand-written"])
    rows = [
        {
            "workload": f"fsdp-x{args.devices}",
            "contender": name,
            "steps_per_s": statistics.median(values),
            "runs": values,
            "vs_reference": statistics.median(values) / reference,
        }
        for name, values in timings.items()
    ]
    lines = ["| workload | contender | steps/s | vs reference |", "| --- | --- | ---: | ---: |"]
    for row in rows:
        speed, ratio = row["steps_per_s"], row["vs_reference"]
        lines.append(f"| {row['workload']} | {row['contender']} | {speed:.2f} | {ratio:.2f}x |")
    table = "\n".join(lines)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.md").write_text(table + "\n")
    (args.out / "bench.json").write_text(json.dumps({"rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
