"""The engines that run a shard plan: processes on this machine, or Ray tasks on a cluster.

Both run the same `run_shard` over the same shards, so their output is the same bytes. The
project schedules little itself: worker processes here, a shard each at a time (`workers`),
Ray's scheduler and its retries there (`ray` is an optional extra, imported only for
`--engine ray`; `raycluster` checks and joins the cluster).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .manifest import DataError
from .plan import Shard
from .raycluster import joined
from .shards import Job, ShardFailed, first_line, is_local, run_shard
from .workers import run_workers

RETRIES = 3  # Ray runs a shard again after a lost worker or an OSError, this many times
FORWARDED = ("STORAGE_EMULATOR_HOST", "GCSFS_", "FSSPEC_", "GOOGLE_CLOUD_PROJECT")
Done = Callable[[dict[str, Any]], None]

__all__ = ["ShardFailed", "run_local", "run_ray"]


def run_local(job: Job, shards: list[Shard], workers: int, done: Done) -> None:
    """Run the shards in `workers` processes (0: one per core); one runs them here."""
    workers = min(workers or os.cpu_count() or 1, len(shards))
    if workers > 1:
        run_workers(job, shards, workers, done)
        return
    for shard in shards:
        try:
            record = run_shard(job, shard)
        except DataError:
            raise
        except Exception as error:  # as a worker would report it: name the shard
            raise ShardFailed(f"{shard.describe()} failed: {first_line(error)}") from None
        done(record)


def run_ray(job: Job, shards: list[Shard], workers: int, address: str, done: Done) -> None:
    """Run the shards as Ray tasks on the cluster at `address`, `workers` at a time (0: as
    many as the cluster has CPUs)."""
    forwarded = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED)}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runtime_env = {
        "py_modules": [root],  # the driver's code, whatever the nodes have installed
        "env_vars": {**forwarded, "TOKENIZERS_PARALLELISM": "false"},
    }
    with joined(address, runtime_env) as ray:
        if is_local(job.out):
            _check_shared(ray, job.out)
        task = ray.remote(num_cpus=1, max_retries=RETRIES, retry_exceptions=[OSError])(
            _on_node
        ).options(name=f"{__name__.split('.')[0]}.prepare")
        _submit(ray, task, ray.put(job), shards, workers, done)


def _on_node(job: Job, shard: Shard) -> dict[str, Any]:
    """A Ray task: the shard's record, and the node that wrote it (for the driver only)."""
    import ray

    return {**run_shard(job, shard), "node": ray.get_runtime_context().get_node_id()}


def _submit(ray: Any, task: Any, job: Any, shards: list[Shard], workers: int, done: Done) -> None:
    waiting = list(shards)
    running: dict[Any, Shard] = {}
    limit = workers or len(shards)
    try:
        while waiting or running:
            while waiting and len(running) < limit:
                shard = waiting.pop(0)
                running[task.remote(job, shard)] = shard
            ready, _ = ray.wait(list(running), num_returns=1)
            shard = running.pop(ready[0])
            try:
                done(ray.get(ready[0]))
            except ray.exceptions.RayTaskError as error:
                cause = getattr(error, "cause", None)
                if isinstance(cause, DataError):  # the data's fault: no retry helps
                    raise DataError(str(cause)) from None
                raise ShardFailed(
                    f"{shard.describe()} failed after {RETRIES} retries: "
                    f"{first_line(getattr(error, 'cause', None) or error)}"
                ) from None
            except ray.exceptions.RayError as error:
                raise ShardFailed(f"{shard.describe()} failed: {first_line(error)}") from None
    finally:
        for ref in running:
            ray.cancel(ref, force=True)


def _check_shared(ray: Any, out: str) -> None:
    """Refuse a local output that some node of the cluster does not see (not a shared mount)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    folder = os.path.abspath(out.removeprefix("file://"))
    probe = os.path.join(folder, f".probe-{os.getpid()}")
    open(probe, "w").close()
    try:
        sees = ray.remote(num_cpus=0)(os.path.exists)
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        checks = [
            sees.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            ).remote(probe)
            for n in nodes
        ]
        for node, seen in zip(nodes, ray.get(checks), strict=True):
            if not seen:
                raise DataError(
                    f"--out {out} is a local folder that node {node['NodeManagerAddress']} "
                    "does not see: give a gs:// URL, or a folder every node mounts"
                )
    finally:
        os.remove(probe)
