"""The training loop, top to bottom: set-up, the step, then the cadence of log, eval, save, stop."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..core import Plan, Precision, memory, ops, runtime
from ..goodput.timeline import Timeline
from ..tasks import Task, block_class, load_task
from .checkpoint import Checkpointer, default_directory, resume_location
from .config import ConfigError, TrainConfig
from .data import training_data
from .diagnostics import Diagnostics
from .evaluation import Evaluator
from .model import (
    build,
    describe_parameters,
    objective_of,
    parameter_counts,
    read_over,
    sharding_rules,
)
from .optim import build_optimizer, build_scheduler
from .reporting import Reporter, steps_line
from .state import Progress
from .step import TrainStep
from .throughput import Meter, Peak, count_flops, throughput_line
from .watch import Preemption, RunWatch, host_peak_bytes


def due(every: int, step: int) -> bool:
    return bool(every) and step % every == 0


def timed(batches: Iterator[Any], clock: Timeline, name: str) -> Iterator[Any]:
    """Each batch, the time its making took recorded as the goodput event `name`."""
    while True:
        with clock.badput(name):
            batch = next(batches, None)
        if batch is None:
            return
        yield batch


def lay_out_reference(
    task: Task, cfg: TrainConfig, model: nn.Module, strategy: Any, blocks: Any, rules: Any
) -> None:
    """For DPO without LoRA: the policy's frozen copy, built and laid out as it is."""
    from ..hf.lora import is_lora

    wants = getattr(task, "wants_copy", None)
    if wants is None or not wants(is_lora(model)):
        return
    built = build(task, cfg)
    reference, _ = strategy.setup_model(built.model, blocks, False, rules, built.source)
    reference.eval()
    for param in reference.parameters():
        param.requires_grad_(False)
    task.reference = reference  # type: ignore[attr-defined]


def run_benchmarks(cfg: TrainConfig, task: Task, model: nn.Module, strategy: Any, read: Any) -> Any:
    """The run's lm-eval tasks (`eval_tasks`), or None without them."""
    if not cfg.eval_tasks:
        return None
    from ..harness.during import RunBenchmarks

    return RunBenchmarks(cfg, task, model, strategy, read)


def fit(
    config: TrainConfig,
    plan: Plan,
    task: Task | None = None,
    model: nn.Module | None = None,
    guard_after: int | None = None,
) -> dict[str, Any]:
    """Train to the configured length (or until SIGTERM) and return the run's summary."""
    cfg, strategy = config, plan.strategy
    precision = Precision.from_name(cfg.precision)
    # Where the time goes, in Google's goodput categories: from here, data loading.
    clock = Timeline.of_run(cfg, default_directory(cfg.run_dir, cfg.checkpoint_dir))
    task = objective_of(cfg, task or load_task(cfg.task, cfg.data, cfg.task_options))

    # ---- set-up --------------------------------------------------------------------
    clock.phase("tpu_init")
    runtime.device()  # the XLA runtime starts here
    clock.phase("training_prep")
    whole_groups = getattr(task, "check_batch", None)
    if whole_groups is not None:  # GRPO: the global batch holds whole groups, said up front
        whole_groups(cfg.batch_size * strategy.local_batch_shards() * strategy.data_layout()[0])
    if cfg.scan_layers:
        strategy.check_scan()
    built = build(task, cfg, model)  # on the meta device, adapted (HF, LoRA, scan), cast
    model = built.model
    model.train()  # from_pretrained gives a model in eval mode: its dropout would be off
    cache = runtime.compile_cache_dir(cfg.compile_cache, plan.accelerator)
    ops.initialize_compile_cache(cache, readonly=not strategy.is_local_master())
    ops.set_rng_state(cfg.seed)
    blocks = block_class(task, model)
    checkpointed = cfg.activation_checkpointing and not cfg.scan_layers
    rules = sharding_rules(task, model, cfg, strategy)
    directory = default_directory(cfg.run_dir, cfg.checkpoint_dir)
    resume_from = resume_location(cfg.resume, directory)
    source = built.source if resume_from is None else read_over(built)
    # Laid out, then given its values where it is placed (only this host's shards).
    model, ties = strategy.setup_model(model, blocks, checkpointed, rules, source)
    lay_out_reference(task, cfg, model, strategy, blocks, rules)  # DPO's frozen copy
    optimizer = build_optimizer(model, cfg, task)  # after the move: it holds device tensors
    ops.prime_optimizer_state(optimizer)
    strategy.place_optimizer_state(optimizer)
    ops.sync()  # parameters and optimizer state are device data from here on
    train_feeder, steps_per_epoch = training_data(task, strategy, cfg)
    total = cfg.max_steps if cfg.max_steps > 0 else (steps_per_epoch or 0) * cfg.max_epochs
    scheduler = build_scheduler(optimizer, cfg, total)
    watch = RunWatch(guard_after, evaluates=bool(cfg.eval_every))
    saver = Checkpointer(
        directory, cfg.keep_checkpoints, cfg.async_checkpoint, plan.accelerator == "tpu",
        strategy, model, optimizer, scheduler, cfg.to_dict(), watch.host_read,
        stream_state=lambda done: train_feeder.stream_state(done.batches_done * cfg.grad_accum),
        timed=clock.checkpoint,
    )  # fmt: skip
    progress = Progress()
    if resume_from is not None:
        progress = saver.restore(resume_from, progress)  # resharded to this strategy
        strategy.place_optimizer_state(optimizer)
    ops.sync()

    master = strategy.is_master()
    replicas = strategy.data_layout()[0]
    global_batch = cfg.batch_size * strategy.local_batch_shards() * replicas
    # GRPO's steps train on rollouts the model generates (alignment/rollouts.py).
    rollouts = getattr(task, "rollouts", None)
    grpo: Any = task  # the objective's hooks, when `rollouts` is its
    evaluate: Any = (
        grpo.evaluator(model, strategy, global_batch, watch.host_read)
        if rollouts is not None
        else Evaluator(task, strategy, precision, cfg, watch.host_read)
    )
    benchmarks = run_benchmarks(cfg, task, model, strategy, watch.host_read)  # eval_tasks
    reporter = Reporter.of_run(cfg, directory, total, master)  # TensorBoard, W&B: `loggers`
    diagnostics = Diagnostics(
        Path(cfg.run_dir), cfg.profile_steps, cfg.profile_port, cfg.metrics_report, master
    )
    step = TrainStep(task, model, optimizer, scheduler, strategy, precision, cfg, watch.host_read)
    flops = count_flops(task, train_feeder.sample)  # of one process's batch
    meter = Meter(
        global_batch * cfg.grad_accum,
        getattr(task, "tokens_per_sample", None),
        flops * replicas * cfg.grad_accum if flops else None,
        Peak.of_job(plan.accelerator),
    )
    state_bytes = memory.state_memory(model, optimizer)
    reference = getattr(task, "reference", None)  # DPO's frozen copy, when it has one
    if getattr(task, "wants_copy", None) is not None:
        held = memory.state_memory(reference, None) if reference is not None else {}
        state_bytes["reference_bytes_per_device"] = held.get("param_bytes_per_device", 0)
        state_bytes["reference_bytes_total"] = held.get("param_bytes_total", 0)
    reporter.line(
        f"{strategy.describe()}; global batch {global_batch} "
        f"({cfg.batch_size} per device of the data axes), eval batch {evaluate.global_batch}, "
        f"{precision.name}"
    )
    reporter.line(ties.describe())
    if built.note:
        reporter.line(built.note)
    parameters = parameter_counts(model)
    reporter.line(describe_parameters(parameters))
    reporter.line(memory.describe(state_bytes, memory.device_peak_bytes(runtime.device())))
    reporter.line(steps_line(total, cfg.max_steps, cfg.max_epochs, steps_per_epoch, progress.step))
    if resume_from is not None:
        reporter.line(
            f"resuming at step {progress.step} (epoch {progress.epoch}) from {resume_from}"
        )
        if saver.restored_note:
            reporter.line(saver.restored_note)

    # ---- the loop ------------------------------------------------------------------
    diverged: list[int] = []  # steps whose logged loss was NaN or infinite
    logged: dict[str, float] = {}  # the last logged values of the step's metrics

    def log_loss(
        at: int, loss: torch.Tensor, lr: float, metrics: dict[str, Any], host: dict[str, float]
    ) -> None:
        with watch.host_read():  # the loss and the step's metrics: one transfer
            value, *values = ops.to_host([loss, *metrics.values()])
        if not math.isfinite(value):
            diverged.append(at)
        progress.losses.append((at, value))
        named = {**dict(zip(metrics, values, strict=True)), **host}
        logged.update(named)
        reporter.scalars(at, {"loss": value, **named, "lr": lr, **meter.tick(at)}, "train")

    first: dict[str, float] = {}
    cadence = max(1, cfg.log_every)  # of host reads: loss logging and the stop agreement
    eval_metrics: dict[str, float] = {}
    evaluated_at = None
    status = "completed"
    if rollouts is not None:  # GRPO's engine on the model, its graphs compiled before the loop
        grpo.prepare_rollouts(model, strategy, global_batch, watch.host_read)
    clock.loop_started(progress.step, master)
    with Preemption() as preemption:
        watch.loop_started(progress.step)
        while progress.step < total and status == "completed":
            micro: list[Any] = []  # the step's micro-batches so far
            stepped = progress.step
            skip = progress.batches_done * cfg.grad_accum  # started there, not read again
            if rollouts is not None:  # generated and scored, timed as their own category
                made = rollouts(
                    model, strategy, global_batch, progress.epoch, skip, watch.host_read
                )
                batches = timed(made, clock, "rollouts")
            else:
                batches = train_feeder.epoch(progress.epoch, skip, saver.restored_stream)
            saver.restored_stream = ""  # the next epoch starts the stream afresh
            for batch in batches:
                micro.append(batch)
                if len(micro) < cfg.grad_accum:
                    continue
                loss = step(micro)  # queued on the device: nothing here waits for it
                micro = []
                progress.step += 1
                progress.batches_done += 1
                at = progress.step
                if cfg.log_every and (due(cfg.log_every, at) or at == total):
                    lr = scheduler.get_last_lr()[0]
                    host = dict(getattr(task, "host_metrics", None) or {})  # a rollout's
                    ops.add_step_closure(log_loss, (at, loss, lr, step.metrics, host))
                    watch.check(at)  # fail fast, on the logging cadence
                ops.sync()  # one graph per optimizer step, however many micro-batches
                if at == watch.start_step + 1:  # compiled and ran: report, then time the rest
                    first = watch.first_step()
                    reporter.line(throughput_line(first))
                    if step.reason is not None:
                        reporter.line(f"step: traced every step ({step.reason})")
                    meter.start(at)
                    reporter.warmed_up(at)
                on_cadence = due(cadence, at)
                # Processes must agree to stop, or one would wait forever in a collective;
                # they exchange their flags (a host read) on the cadence only.
                with watch.host_read(possible=on_cadence):
                    if strategy.agree_to_stop(bool(diverged), on_cadence):
                        status = "diverged"
                        break
                if due(cfg.eval_every, at):
                    with clock.badput("eval"):
                        eval_metrics, evaluated_at = evaluate(model), at
                        eval_metrics.update(benchmarks() if benchmarks else {})
                    reporter.scalars(at, eval_metrics, "eval")
                    # Every process holds the same reduced value: they take the same branch.
                    if eval_metrics["loss"] < progress.best:  # never true for NaN
                        progress.best = eval_metrics["loss"]
                        if cfg.checkpoint_every:
                            saver.save(progress, best=True)
                if due(cfg.checkpoint_every, at) and saver.save(progress) is None:
                    status = "diverged"  # the weights are not finite: nothing was written
                    break
                watch.after_step(at, evaluate.runs)
                diagnostics.after_step(at, watch.clock)
                clock.step(at)  # before the stop: a stop-and-save belongs to the disruption
                with watch.host_read(possible=on_cadence):
                    requested = strategy.agree_to_stop(preemption.requested, on_cadence)
                if requested or saver.reached_preemption(at):
                    status = "preempted"
                    break
                if at >= total:
                    break
            else:
                if progress.step == stepped:  # a stream that ran dry: it would loop forever
                    raise ConfigError(
                        f"epoch {progress.epoch} of the training data has no full batch"
                    )
                progress.epoch += 1
                progress.batches_done = 0
    watch.loop_ended()
    clock.loop_ended(status)

    # ---- the end -------------------------------------------------------------------
    rate = watch.steps_per_second(progress.step)
    host_ms = watch.host_ms_per_step(progress.step)
    if status == "completed" and evaluated_at != progress.step:
        with clock.badput("eval"):  # an evaluation is badput wherever it runs
            eval_metrics = evaluate(model)
            eval_metrics.update(benchmarks() if benchmarks else {})
        reporter.scalars(progress.step, eval_metrics, "eval")
    if benchmarks:
        benchmarks.close()
    if status != "diverged" and saver.save(progress) is None:
        status = "diverged"
    saver.finish()  # background writes done, or their failure raised
    summary: dict[str, Any] = {
        "status": status,
        "diverged_at": diverged[0]
        if diverged
        else (progress.step if status == "diverged" else None),
        "checkpoint": saver.last_good,
        "steps": progress.step,
        "epochs": progress.epoch,
        "final_train_loss": progress.losses[-1][1] if progress.losses else None,
        "train_losses": [list(item) for item in progress.losses],
        "train_metrics": logged,
        "eval": eval_metrics,
        **watch.counters(),
        "steps_per_second": round(rate, 3),
        "host_ms_per_step": round(host_ms, 3),
        **first,
        "throughput": meter.summary(rate),
        "accelerator": plan.accelerator,
        "strategy": strategy.name,
        "devices": runtime.global_device_count(),
        "precision": precision.name,
        "global_batch": global_batch,
        "tied_parameters": ties.to_dict(),
        "parameters": parameters,
        "compile_cache": ops.compile_cache_use(cache),
        "step": {
            "replayed": step.reason is None,
            "traced_because": step.reason,
            "warmup_reads": step.replayed.reads,
        },
        "memory": {
            **state_bytes,
            "device_peak_bytes": memory.device_peak_bytes(runtime.device()),
            # The host's peak by the end of the training steps, and by the end of the run
            # (the closing evaluation and save): the second should not tower over the first.
            "host_peak_bytes_training": watch.host_peak_in_loop,
            "host_peak_bytes": host_peak_bytes(),
        },
        "run_dir": str(cfg.run_dir),
    }
    summary["records"] = clock.finished(status, progress.step)
    # The step, and the evaluation's graph (GRPO's evaluation runs the engine's, compiled
    # with the set-up).
    graphs = 1 + (1 if cfg.eval_every and rollouts is None else 0)
    steps_run = progress.step - watch.start_step
    summary.update(diagnostics.finish(watch.loop_counters(), steps_run, graphs, watch.loop_reads))
    return watch.report(reporter, summary)
