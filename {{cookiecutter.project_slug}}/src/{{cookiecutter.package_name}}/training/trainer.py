"""The training loop: XLA-correct by construction, resumable, and safe to preempt."""

from __future__ import annotations

import contextlib
import math
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from ..core import (
    DeviceFeeder,
    Plan,
    Precision,
    eval_dataloader,
    health,
    move_to_device,
    ops,
    prepare_dataloader,
    replica_layout,
    runtime,
)
from .checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    restore_rng_states,
    rng_states,
    save_checkpoint,
)
from .config import ConfigError, TrainConfig
from .diagnostics import Diagnostics
from .reporting import Reporter
from .tasks import Task, load_task


def lr_lambda(schedule: str, warmup: int, total: int) -> Any:
    """Linear warm-up, then cosine/linear decay to 10% (or constant)."""

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "linear":
            return 1.0 - 0.9 * progress
        return 0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))

    return factor


@dataclass
class Progress:
    """Host-side position in the run: what a checkpoint must restore."""

    step: int = 0
    epoch: int = 0
    batches_done: int = 0  # optimizer steps already taken in `epoch`
    losses: list[tuple[int, float]] = field(default_factory=list)
    best: float = math.inf


class Trainer:
    """Fits a task's model under a plan. Build it in the process that trains.

    `guard_after=N` wraps the rest of the loop in an `XlaGuard` once N steps (and the
    first in-loop eval) have run: `fit()` then raises `XlaHealthError` at the next
    logging step if a graph is compiled, a CPU fallback op runs, or the device is read
    outside the trainer's own host reads (logging, eval totals, checkpoints).
    """

    def __init__(
        self,
        config: TrainConfig,
        plan: Plan,
        task: Task | None = None,
        model: nn.Module | None = None,
        guard_after: int | None = None,
    ) -> None:
        self.config = config
        self.plan = plan
        self.precision = Precision.from_name(config.precision)
        self.task = task or load_task(config.task, config.data, config.task_options)
        ops.seed_host(config.seed)  # the model's initial weights depend on it
        self.model = model if model is not None else self.task.build_model()
        self.strategy = plan.strategy
        self.progress = Progress()
        self.stop_requested = False
        self.eval_metrics: dict[str, float] = {}
        self.guard_after = guard_after
        self.guard: health.XlaGuard | None = None
        self.guard_armed_at: int | None = None
        self.guard_result: dict[str, int] | None = None
        self.evaluations = 0
        self.evaluated_at: int | None = None  # step of the latest in-loop eval

    # ---- set-up -------------------------------------------------------------------------
    def _setup(self, resume_state: dict[str, Any] | None, report: bool = True) -> None:
        cfg = self.config
        ops.initialize_compile_cache(cfg.compile_cache)
        ops.set_rng_state(cfg.seed)
        self.device = runtime.device()
        self.replicas, self.rank = replica_layout(self.strategy)
        self.is_master = runtime.is_master()
        local = runtime.addressable_device_count() if self.strategy == "spmd" else 1
        if resume_state is not None:
            self.model.load_state_dict(resume_state["model"])
        self.precision.convert_module(self.model)
        move_to_device(self.model, self.device)
        # Optimizers come after the move, so they hold the device (and re-tied) parameters.
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay
        )
        train_set, eval_set = self.task.datasets()
        per_process = cfg.batch_size * local
        if len(train_set) < per_process * self.replicas * cfg.grad_accum:  # type: ignore[arg-type]
            raise ConfigError(
                f"the training set has {len(train_set)} samples, fewer than one global batch "  # type: ignore[arg-type]
                f"({per_process * self.replicas * cfg.grad_accum}): lower batch_size"
            )
        loader = DataLoader(
            train_set,
            batch_size=per_process,
            shuffle=True,
            drop_last=True,  # static shapes: the ragged last batch would compile a new graph
            num_workers=cfg.num_workers,
        )
        sharded = prepare_dataloader(loader, self.replicas, self.rank, seed=cfg.seed)
        self.train_feeder = DeviceFeeder(sharded, self.strategy, batches_per_step=cfg.grad_accum)
        self.steps_per_epoch = len(sharded) // cfg.grad_accum
        self.total_steps = (
            cfg.max_steps if cfg.max_steps > 0 else self.steps_per_epoch * cfg.max_epochs
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(cfg.schedule, cfg.warmup_steps, self.total_steps)
        )
        eval_loader = eval_dataloader(
            eval_set,
            cfg.eval_batch_size * local,
            self.replicas,
            self.rank,
            num_workers=cfg.num_workers,
        )
        self.eval_feeder = DeviceFeeder(eval_loader, self.strategy)
        if resume_state is not None:
            self._restore(resume_state)
        ops.prime_adam_state(self.optimizer)
        if self.strategy == "spmd":
            ops.replicate_state(self.model, self.optimizer)
        self.reporter = Reporter(Path(cfg.run_dir), self.total_steps, self.is_master and report)
        self.diagnostics = Diagnostics(
            Path(cfg.run_dir),
            cfg.profile_steps,
            cfg.profile_port,
            cfg.metrics_report,
            self.is_master and report,
        )
        kind = "TPU" if self.plan.accelerator == "tpu" else "XLA:CPU"
        self.reporter.line(
            f"{self.strategy} on {runtime.global_device_count()} {kind} device(s), "
            f"{runtime.process_count()} process(es); global batch "
            f"{per_process * self.replicas}, {self.precision.name}"
        )

    def _restore(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.progress = Progress(
            step=state["step"],
            epoch=state["epoch"],
            batches_done=state["batches_done"],
            losses=[(int(s), float(v)) for s, v in state["losses"]],
            best=float(state["best"]),
        )
        restore_rng_states(state["rng"])

    @contextlib.contextmanager
    def _host_read(self) -> Iterator[None]:
        """A deliberate device-to-host read: the armed guard allows the transfers it makes."""
        guard = self.guard
        before = health.transfer_count() if guard is not None else 0
        yield
        if guard is not None:
            guard.allow(health.transfer_count() - before)

    # ---- checkpoints --------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        p = self.progress
        return {
            "model": ops.to_cpu(self.model.state_dict()),
            "optimizer": ops.to_cpu(self.optimizer.state_dict()),
            "scheduler": self.scheduler.state_dict(),
            "step": p.step,
            "epoch": p.epoch,
            "batches_done": p.batches_done,
            "losses": [list(item) for item in p.losses],
            "best": p.best,
            "config": self.config.to_dict(),
            "rng": rng_states(),
        }

    def save(self, name: str | None = None) -> Path | None:
        """Write a checkpoint from the master process; every replica waits for it."""
        ops.sync()
        path = None
        if self.is_master:
            with self._host_read():
                state = self._state()
            path = save_checkpoint(
                state,
                self.config.run_dir,
                self.progress.step,
                self.config.keep_checkpoints,
                name,
            )
        ops.rendezvous("checkpoint", self.strategy)
        return path

    # ---- the loop ---------------------------------------------------------------------
    def _log_train(self, step: int, loss: torch.Tensor, lr: float) -> None:
        with self._host_read():
            value = float(loss.item())
        self.progress.losses.append((step, value))
        self.reporter.scalars(step, {"loss": value, "lr": lr}, "train")

    def _train_step(self, batch: dict[str, torch.Tensor], micro: int) -> torch.Tensor:
        batch = self.precision.convert_batch(batch)
        with self.precision.forward_context():
            loss = self.task.loss(self.model, batch)
        # Dividing by 1 would still add a node to every step's graph.
        (loss / self.config.grad_accum if self.config.grad_accum > 1 else loss).backward()
        if micro + 1 == self.config.grad_accum:
            ops.reduce_gradients(self.optimizer, self.strategy)
            if self.config.grad_clip:  # after the cross-replica reduction
                nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
        return loss.detach().float()

    def _should_stop(self, step: int) -> bool:
        if self.strategy != "ddp":
            return self.stop_requested
        # Replicas must agree, or one would wait forever in a collective: ask on a cadence.
        if step % max(1, self.config.log_every) == 0:
            with self._host_read():
                return ops.agree_any(self.stop_requested, self.strategy)
        return False

    def fit(self) -> dict[str, Any]:
        """Train to the configured length (or until SIGTERM) and return the summary."""
        cfg = self.config
        state = None
        if cfg.resume:
            found = latest_checkpoint(cfg.run_dir)
            state = load_checkpoint(found) if found else None
        self._setup(state)
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            status = self._loop()
            if self.guard is not None:
                self.guard.check()
                self.guard_result = self._guard_summary()
                self.guard = None  # the final eval and save are outside the window
        finally:
            signal.signal(signal.SIGTERM, previous)
        return self._finish(status)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.stop_requested = True

    def _loop(self) -> str:
        cfg, p = self.config, self.progress
        ops.sync()
        self.health_start = health.snapshot()
        self.start_step = p.step
        self.timer: tuple[int, float] | None = None
        if p.step:
            self.reporter.line(f"resuming at step {p.step} (epoch {p.epoch})")
        while p.step < self.total_steps:
            micro = 0
            for batch in self.train_feeder.epoch(p.epoch, p.batches_done * cfg.grad_accum):
                last_loss = self._train_step(batch, micro)
                micro += 1
                if micro < cfg.grad_accum:
                    continue
                micro = 0
                p.step += 1
                p.batches_done += 1
                if cfg.log_every and (p.step % cfg.log_every == 0 or p.step == self.total_steps):
                    lr = self.scheduler.get_last_lr()[0]
                    ops.add_step_closure(self._log_train, (p.step, last_loss, lr))
                    if self.guard is not None:
                        self.guard.check()  # fail fast, on the logging cadence
                if self.timer is None and p.step >= 3:
                    ops.sync()
                    ops.wait()
                    self.timer = (p.step, time.perf_counter())
                self.diagnostics.after_step(p.step, self.timer)
                if cfg.eval_every and p.step % cfg.eval_every == 0:
                    self._evaluate_and_decide()
                if cfg.checkpoint_every and p.step % cfg.checkpoint_every == 0:
                    self.save()
                if self.guard is None and self._warm_for_guard(p.step):
                    self.guard = health.XlaGuard()
                    self.guard.__enter__()
                    self.guard_armed_at = p.step
                if self._should_stop(p.step):
                    self.loop_health = health.snapshot().since(self.health_start)
                    self.save()
                    return "preempted"
                if p.step >= self.total_steps:
                    break
            else:
                p.epoch += 1
                p.batches_done = 0
        ops.sync()
        self.loop_health = health.snapshot().since(self.health_start)
        return "completed"

    def _warm_for_guard(self, step: int) -> bool:
        """True once `guard_after` steps and, if the loop evaluates, one eval have run."""
        if self.guard_after is None or step < self.guard_after:
            return False
        return not self.config.eval_every or self.evaluations > 0

    def evaluate(self) -> dict[str, float]:
        """Metrics over the whole eval set, summed across replicas, padding excluded."""
        self.model.eval()
        sums: dict[str, torch.Tensor] | None = None
        # XLA_USE_BF16 stores every device float as bf16 (4096 + 1 == 4096), so the
        # legacy mode sums on the host instead, at one transfer per eval batch.
        host: dict[str, float] = {}
        self.evaluations += 1
        with torch.no_grad():
            for batch in self.eval_feeder.epoch(0):
                batch = self.precision.convert_batch(batch)
                with self.precision.forward_context():
                    part = self.task.eval_sums(self.model, batch)
                if self.precision.legacy_env:
                    part = {k: ops.all_reduce_sum(v, self.strategy) for k, v in part.items()}
                    with self._host_read():
                        for key, value in part.items():
                            host[key] = host.get(key, 0.0) + float(value.item())
                    continue
                if sums is None:
                    # Host zeros of shape (1,) arrive as device data (0-d ones would be
                    # constants), like later batches' sums: every batch runs one graph.
                    sums = {k: torch.zeros(1, dtype=torch.float32).to(self.device) for k in part}
                sums = {k: sums[k] + part[k].float() for k in sums}
        self.model.train()
        if sums is not None:
            reduced = {k: ops.all_reduce_sum(v, self.strategy) for k, v in sums.items()}
            ops.sync()
            with self._host_read():
                host = {k: float(v.item()) for k, v in reduced.items()}
        return self.task.finalize(host)

    def evaluate_checkpoint(self, state: dict[str, Any]) -> dict[str, float]:
        """Evaluate a checkpoint's weights; writes nothing."""
        self.model.load_state_dict(state["model"])
        self._setup(None, report=False)
        return self.evaluate()

    def _evaluate_and_decide(self) -> None:
        self.eval_metrics = self.evaluate()
        self.evaluated_at = self.progress.step
        self.reporter.scalars(self.progress.step, self.eval_metrics, "eval")
        # Every replica holds the same reduced value, so they all take the same branch.
        if self.eval_metrics["loss"] < self.progress.best:
            self.progress.best = self.eval_metrics["loss"]
            if self.config.checkpoint_every:
                self.save("best.pt")

    def _guard_summary(self) -> dict[str, int] | None:
        guard = self.guard
        if guard is None or guard.delta is None or self.guard_armed_at is None:
            return None
        return {
            "armed_at_step": self.guard_armed_at,
            "compilations": guard.delta.compilations,
            "transfers": guard.delta.transfers,
            "allowed_transfers": guard.allowed_transfers,
        }

    def _finish(self, status: str) -> dict[str, Any]:
        p = self.progress
        steps_per_second = 0.0
        ops.wait()
        if self.timer is not None and p.step > self.timer[0]:
            steps_per_second = (p.step - self.timer[0]) / (time.perf_counter() - self.timer[1])
        if status == "completed":
            if self.evaluated_at != p.step:  # the loop may have just evaluated this step
                self.eval_metrics = self.evaluate()
                self.reporter.scalars(p.step, self.eval_metrics, "eval")
            self.save()
        delta = health.snapshot().since(self.health_start)
        summary: dict[str, Any] = {
            "status": status,
            "steps": p.step,
            "epochs": p.epoch,
            "final_train_loss": p.losses[-1][1] if p.losses else None,
            "train_losses": [list(item) for item in p.losses],
            "eval": self.eval_metrics,
            "compilations": delta.compilations,
            "fallback_ops": delta.fallback_ops,
            "loop_transfers": self.loop_health.transfers,
            "loop_compilations": self.loop_health.compilations,
            "steps_per_second": round(steps_per_second, 3),
            "guard": self.guard_result,
            "accelerator": self.plan.accelerator,
            "strategy": self.strategy,
            "devices": runtime.global_device_count(),
            "precision": self.precision.name,
            "run_dir": str(self.config.run_dir),
        }
        graphs = 1 + (1 if self.config.eval_every else 0)
        summary.update(self.diagnostics.finish(self.loop_health, p.step - self.start_step, graphs))
        for finding in summary["diagnosis"]:
            self.reporter.line(f"diagnosis: {finding}")
        for key in ("metrics_report", "profile"):
            if key in summary:
                self.reporter.line(f"{key.replace('_', ' ')}: {summary[key]}")
        path = self.reporter.summary(summary)
        if path is not None:
            self.reporter.line(f"{status}: {p.step} steps; summary written to {path}")
        return summary
