"""Steps/s of the training loop beside a hand-written FSDP2 (+ DTensor) + torch.compile loop.

    python benchmarks/bench.py [--devices 2] [--steps 60] [--rounds 3] [--out runs/bench]

Two workloads of the example task on CPU processes over gloo off a TPU: `fsdp-x{devices}`
(FSDP2 over `--devices` processes) and `fsdp-x-tensor-2x2` (four processes, mesh
`fsdp=2,tensor=2`: the blocks' layers tensor-parallel through DTensor, FSDP2 over the
rest). Two contenders on the same model, mesh, batch, precision (fp32), AdamW and
gradient clipping at 1.0, each step compiled by torch.compile with the same backend
(`aot_eager` on the CPU): the hand-written loop, as PyTorch's FSDP2 and tensor-parallel
tutorials write it (`parallelize_module` with a hand-written plan of the blocks' linear
layers, `fully_shard` per block and on the model, forward and backward compiled as one
function and the update as another, the clip between them run eagerly as torchtitan runs
it, its norm taken per mesh and made whole with `full_tensor()`, a constant learning
rate, the loss read every 20 steps), and the
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


# Tensor-parallel layers of the example's blocks, as a user writes them by hand:
# ColwiseParallel before the activation, RowwiseParallel after it.
TENSOR_PLANS = {
    "lm": {"attn.qkv": "colwise", "attn.out": "rowwise", "mlp.0": "colwise", "mlp.2": "rowwise"},
    "hf-causal-lm": {"self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise",
                     "self_attn.v_proj": "colwise", "self_attn.o_proj": "rowwise",
                     "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
                     "mlp.down_proj": "rowwise"},
}  # fmt: skip


def config(devices: int, steps: int, run_dir: str, mesh: str = "") -> TrainConfig:
    """The run both contenders make: the example task, fsdp over `devices` processes."""
    return TrainConfig(
        task="{{ cookiecutter.example_task }}",
        accelerator="cpu",
        devices=str(devices),
        strategy="fsdp",
        mesh=mesh,
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
    """The FSDP2 (+ tensor parallel) + torch.compile loop, in each process; process 0's
    steps/s."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    from torch.utils.data import DataLoader, DistributedSampler

    device = runtime.device()
    task = load_task(cfg.task, cfg.data, cfg.task_options)
    torch.manual_seed(cfg.seed)
    model = move_to_device(task.build_model(), device)  # tied weights kept tied
    world = dist.get_world_size()
    tensor = 2 if cfg.mesh else 1
    names = ("fsdp", "tensor")
    mesh = init_device_mesh(device.type, (world // tensor, tensor), mesh_dim_names=names)
    blocks = block_class(task, model)
    block_modules = [m for m in model.modules() if blocks and isinstance(m, blocks)]
    if tensor > 1:
        styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
        plan = {name: styles[style]() for name, style in TENSOR_PLANS[cfg.task].items()}
        for module in block_modules:
            parallelize_module(module, mesh["tensor"], plan)
    for module in block_modules:
        fully_shard(module, mesh=mesh["fsdp"])
    fully_shard(model, mesh=mesh["fsdp"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    dataset = task.train_dataset()
    rank = dist.get_rank() // tensor  # a tensor group reads one batch
    sampler = DistributedSampler(dataset, world // tensor, rank, shuffle=True, seed=cfg.seed,
                                 drop_last=True)  # fmt: skip
    loader = DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler, drop_last=True)
    params = list(model.parameters())

    def clip(max_norm: float) -> None:
        # torch's clip stacks the norms of DTensors on different meshes, which fails: one
        # norm per mesh, made whole, then one scale.
        groups: dict[object, list[torch.Tensor]] = {}
        for param in params:
            if param.grad is not None:
                groups.setdefault(getattr(param.grad, "device_mesh", None), []).append(param.grad)
        norms = []
        for grads in groups.values():
            norm = torch.nn.utils.get_total_norm(grads)
            norms.append(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        total = torch.linalg.vector_norm(torch.stack(norms))
        scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for grads in groups.values():
            for grad in grads:
                grad.mul_(scale)

    @torch.compile(backend=compile_backend(), dynamic=False)
    def forward_backward(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        loss = task.loss(model, batch)
        loss.backward()
        return loss.detach()

    @torch.compile(backend=compile_backend(), dynamic=False)
    def update() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        loss = forward_backward(batch)
        clip(cfg.grad_clip)  # eager, between the compiled parts, as torchtitan clips
        update()
        return loss

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


def run(contender: str, devices: int, steps: int, mesh: str) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        cfg = config(devices, steps, scratch, mesh)
        plan = make_plan("cpu", devices, "fsdp", mesh=mesh)
        if contender == "hand-written":
            result = launch(hand_written, plan, args=(cfg,))
        else:
            result = launch(fit, plan, args=(cfg, plan))
    return float(result["steps_per_second"])


def parser() -> argparse.ArgumentParser:
    """The command line this script takes (the docs' commands are checked against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("runs/bench"))
    return parser


def main() -> None:
    args = parser().parse_args()
    runtime.configure("cpu")
    workloads = {f"fsdp-x{args.devices}": (args.devices, ""),
                 "fsdp-x-tensor-2x2": (4, "fsdp=2,tensor=2")}  # fmt: skip
    rows = []
    for workload, (devices, mesh) in workloads.items():
        timings: dict[str, list[float]] = {"hand-written": [], "trainer": []}
        for _ in range(args.rounds):
            for contender in timings:
                timings[contender].append(run(contender, devices, args.steps, mesh))
        reference = statistics.median(timings["hand-written"])
        rows += [
            {
                "workload": workload,
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
