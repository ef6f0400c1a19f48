"""The contenders: the same training, written by hand with torch_xla, through this
project's `fit`, and through Accelerate. Each returns its steps/s and XLA counters."""

from __future__ import annotations

import functools
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from {{ cookiecutter.package_name }}.core import health, make_plan, move_to_device
from {{ cookiecutter.package_name }}.hf import is_hf_model, unwrap
from {{ cookiecutter.package_name }}.hf.masks import static_masks
from {{ cookiecutter.package_name }}.hf.moe import experts_modules, prepare_experts
from {{ cookiecutter.package_name }}.training import TrainConfig, fit
from {{ cookiecutter.package_name }}.training.optim import lr_lambda

from workloads import CHECKPOINT_EVERY, CONFIG, LOG_EVERY, STRATEGY, WARMUP_STEPS


class Clock:
    """Starts after the warm-up steps with the device idle; stops when it is idle again.

    It also reads XLA's counters over the whole loop, warm-up included, and this thread's
    CPU time over the timed steps: the host's time per step, which waiting costs none of.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.start = 0.0
        self.host_start = 0.0
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
            self.host_start = time.thread_time()

    def result(self) -> dict[str, Any]:
        import torch_xla.core.xla_model as xm

        host = time.thread_time() - self.host_start
        xm.wait_device_ops()
        steps = self.total - WARMUP_STEPS
        rate = steps / (time.perf_counter() - self.start)
        delta = health.snapshot().since(self.health)
        return {
            "rate": rate,
            "host_ms": host * 1e3 / steps,
            "first_step": self.first_step,
            **delta.__dict__,
        }


def optimizer_and_schedule(model: nn.Module, total: int) -> tuple[Any, Any]:
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=CONFIG.lr, weight_decay=CONFIG.weight_decay
    )
    schedule = lr_lambda(CONFIG.schedule, CONFIG.warmup_steps, total)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def hand_written(task: Any, total: int, devices: int, workload: str) -> dict[str, Any]:
    """The loop of torch_xla's examples: MpDeviceLoader, an optimizer step, step closures.

    Data parallel on one device or over an SPMD `data` axis; for the fsdp workload,
    FSDPv2 as its documentation writes it: each block wrapped, the batch sharded. A
    Hugging Face model gets what an expert does by hand (`for_xla_by_hand`).
    """
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.parallel_loader as pl

    device = torch_xla.device()
    torch.manual_seed(CONFIG.seed)
    axis = "fsdp" if workload == "fsdp" else "data"
    mesh = spmd_mesh(devices, axis) if devices > 1 else None
    # Moved with its tied weights kept: `.to(xla)` unties them (another model, more to train).
    model = move_to_device(for_xla_by_hand(task.build_model()), device)
    if workload == "fsdp":
        model = fsdpv2(model, task, mesh)
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


def for_xla_by_hand(model: nn.Module) -> nn.Module:
    """A transformers model as an expert trains it on XLA; any other model as it is.

    The mask fix: `static_masks()` has transformers build attention masks from tensors.
    Without it every forward reads the device (its packed-sequence check), which cuts
    each step in two graphs and waits for the device. The key/value cache is off: a
    training step never reads it. A mixture of experts gets the same static experts and
    router loss as the training loop (`hf/moe.py`): the loops differ, not the model.
    """
    if not is_hf_model(model):
        return model
    static_masks()
    unwrap(model).config.use_cache = False
    if experts_modules(model):
        prepare_experts(model)
    return model


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


def trainer(
    task: Any,
    total: int,
    devices: int,
    workload: str,
    saves: str = "",
    replay: bool = True,
    wandb_on: bool = False,
) -> dict[str, Any]:
    """The training loop through its public API, default features on, eval off.

    `saves` ("sync" or "async") checkpoints every CHECKPOINT_EVERY steps; `replay=False`
    traces every step (`replay_step = false`), to show what replaying saves the host;
    `wandb_on` logs to a W&B run (offline, in the run's folder) beside TensorBoard.
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
            replay_step=replay,
            loggers=["tensorboard", "wandb"] if wandb_on else ["tensorboard"],
            wandb={"mode": "offline", "project": "bench"} if wandb_on else {},
        )
        summary = fit(config, make_plan("cpu", devices, strategy), task=task)
    # Its timer starts after step 3 too; its loop counters exclude the final eval and save.
    return {
        "rate": float(summary["steps_per_second"]),
        "host_ms": float(summary["host_ms_per_step"]),
        "compilations": summary["loop_compilations"],
        "transfers": summary["loop_transfers"],
        "fallback_ops": summary["fallback_ops"],
        "eval_graphs": summary["compilations"] - summary["loop_compilations"],
        "first_step": summary["time_to_first_step_s"],
        "flops_per_step": summary["throughput"]["flops_per_step"],
        "tokens_per_step": summary["global_batch"] * (getattr(task, "tokens_per_sample", 0) or 0),
        "parameters": summary["parameters"],
    }


CONTENDERS: dict[str, Callable[[Any, int, int, str], dict[str, Any]]] = {
    "hand-written": hand_written,
    "trainer": trainer,
    "trainer (traced)": functools.partial(trainer, replay=False),
    "accelerate": accelerate_loop,
    "trainer+sync saves": functools.partial(trainer, saves="sync"),
    "trainer+async saves": functools.partial(trainer, saves="async"),
    "trainer+wandb": functools.partial(trainer, wandb_on=True),
}
