"""The engines that run a shard plan: processes on this machine, or Ray tasks on a cluster.

Both run the same `run_shard` over the same shards, so their output is the same bytes. The
project schedules nothing itself: a process pool here, Ray's scheduler and its retries
there (`ray` is an optional extra, imported only for `--engine ray`).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
from collections.abc import Callable
from typing import Any

from .manifest import DataError
from .plan import Shard
from .shards import Job, is_local, run_shard

RETRIES = 3  # Ray runs a shard again after a lost worker or an OSError, this many times
FORWARDED = ("STORAGE_EMULATOR_HOST", "GCSFS_", "FSSPEC_", "GOOGLE_CLOUD_PROJECT")
Done = Callable[[dict[str, Any]], None]


class ShardFailed(RuntimeError):
    """A shard that could not be written (not the data's fault): a rerun resumes."""


_job: Job | None = None


def _start_worker(job: Job) -> None:
    global _job
    _job = job
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver stops the pool, and says so
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the driver's handler (fork copies it)


def _run(shard: Shard) -> dict[str, Any]:
    assert _job is not None
    try:
        return run_shard(_job, shard)
    except DataError:
        raise
    except Exception as error:  # the pool returns it to the driver: name the shard
        raise ShardFailed(f"{shard.describe()} failed: {_first_line(error)}") from None


def run_local(job: Job, shards: list[Shard], workers: int, done: Done) -> None:
    """Run the shards in `workers` processes (0: one per core); one runs them here."""
    workers = min(workers or os.cpu_count() or 1, len(shards))
    if workers <= 1:
        global _job
        _job = job
        for shard in shards:
            done(_run(shard))
        return
    # fork: a worker starts at once with what the driver has imported, and `prepare` called
    # from a script needs no `if __name__ == "__main__"` guard (spawn would re-run it).
    context = multiprocessing.get_context("fork")
    with context.Pool(workers, _start_worker, (job,)) as pool:
        try:
            for record in pool.imap_unordered(_run, shards):
                done(record)
        except BaseException:
            pool.terminate()
            raise


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return f"{type(error).__name__}: {text.splitlines()[0][:300]}"


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise DataError(
            "--engine ray needs the `ray` package, which is not installed: pip install -e "
            "'.[ray]' (or use --engine local)"
        ) from None
    return ray


def check_reachable(address: str) -> None:
    """Refuse, in a moment, an address where no Ray head answers."""
    if address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=5):
            return
    except (OSError, ValueError):
        raise DataError(
            f"no Ray cluster answers at {address!r}: start one (make ray-up, or ray up "
            "configs/ray-cluster.yaml) and set RAY_ADDRESS or --ray-address to its head"
        ) from None


def run_ray(job: Job, shards: list[Shard], workers: int, address: str, done: Done) -> None:
    """Run the shards as Ray tasks on the cluster at `address`, `workers` at a time (0: as
    many as the cluster has CPUs)."""
    import logging

    ray = import_ray()

    forwarded = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED)}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runtime_env = {
        "py_modules": [root],  # the driver's code, whatever the nodes have installed
        "env_vars": {**forwarded, "TOKENIZERS_PARALLELISM": "false"},
    }
    try:
        ray.init(address=address, runtime_env=runtime_env, logging_level=logging.ERROR,
                 log_to_driver=False, configure_logging=False)  # fmt: skip
    except (ConnectionError, RuntimeError, ValueError) as error:
        message = f"cannot join the Ray cluster at {address!r}: {_first_line(error)}"
        raise DataError(message) from None
    try:
        if is_local(job.out):
            _check_shared(ray, job.out)
        task = ray.remote(num_cpus=1, max_retries=RETRIES, retry_exceptions=[OSError])(
            _on_node
        ).options(name=f"{__name__.split('.')[0]}.prepare")
        _submit(ray, task, ray.put(job), shards, workers, done)
    finally:
        ray.shutdown()


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
                    f"{_first_line(getattr(error, 'cause', None) or error)}"
                ) from None
            except ray.exceptions.RayError as error:
                raise ShardFailed(f"{shard.describe()} failed: {_first_line(error)}") from None
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
