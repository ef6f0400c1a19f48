"""One process per device on this host, started through torchrun's launcher, with the
errors every process meets alike raised once in the launching process."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .. import runtime

# torchrun's launcher stops its processes at once on these; SIGTERM they handle themselves.
HANDLED_BY_THE_LAUNCHER = "SIGINT,SIGHUP,SIGQUIT"


def spawn(strategy: Any, fn: Callable[..., Any], args: tuple[Any, ...], start_method: str) -> Any:
    """Start one process per device on this host through torchrun's launcher (a c10d
    rendezvous on a free local port) and return process 0's result.

    An expected error (a bad config, a checkpoint that cannot be read: a ValueError) comes
    back from every process and is raised here as it was raised there, in one line; a
    crash stops the other processes and raises RuntimeError with its last line.
    """
    import logging

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if strategy.accelerator == "tpu":
        # TorchTPU's launcher helper sets the slice's addresses and topology for the
        # processes (TORCH_TPU_SLICEBUILDER_ADDRESSES, TORCH_TPU_TOPOLOGY): a TPU only.
        from torch.tpu.distributed import environment  # type: ignore[import-not-found]

        environment.set_tpu_launch_env(nproc_per_node=strategy.cpu_devices())
    for name in ("torch.distributed.elastic", "torch.multiprocessing"):
        logging.getLogger(name).setLevel(logging.ERROR)  # the launcher's own chatter
    pod = runtime.hosts()
    if pod.count > 1:  # every host's launcher meets at the first host's store
        rendezvous: dict[str, Any] = {
            "rdzv_backend": "static",
            "rdzv_endpoint": f"{pod.coordinator}:{pod.port}",
            "rdzv_configs": {"rank": pod.rank, "timeout": 900},
            "run_id": "{{ cookiecutter.project_slug }}",
        }
    else:  # one host: a store on a free local port, no other run can meet it
        rendezvous = {"rdzv_backend": "c10d", "rdzv_endpoint": "localhost:0",
                      "run_id": uuid.uuid4().hex}  # fmt: skip
    config = LaunchConfig(
        min_nodes=pod.count,
        max_nodes=pod.count,
        nproc_per_node=strategy.cpu_devices(),
        max_restarts=0,
        monitor_interval=0.1,
        signals_to_handle=HANDLED_BY_THE_LAUNCHER,  # not SIGTERM: `_sigterm_forwarded`
        start_method="fork" if start_method == "fork" else "spawn",
        **rendezvous,
    )
    try:
        with _sigterm_forwarded():
            results = elastic_launch(config, _process_entry)(strategy, fn, args)
    except ChildFailedError as error:
        rank, failure = error.get_first_failure()
        raw = failure.message
        message = str(raw.get("message", raw) if isinstance(raw, dict) else raw)
        last = message.strip().splitlines()[-1] if message.strip() else "failed"
        raise RuntimeError(f"process {rank} failed: {last}") from None
    for rank in sorted(results):
        if isinstance(results[rank], _Failed):
            raise results[rank].error
    return results[min(results)]  # this host's first process (the job's on host 0)


@contextlib.contextmanager
def _sigterm_forwarded() -> Iterator[None]:
    """SIGTERM (a preemption notice, a `kill`) goes on to the processes, which agree on a
    step, save it and return; torchrun's launcher would stop them at once instead. Its
    handling of SIGINT, SIGHUP and SIGQUIT stays."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _forward)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _forward(signum: int, _frame: object) -> None:
    """Send the signal on to every process this one started to train, and say so."""
    workers = _workers()
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
    print(f"SIGTERM: sent on to {len(workers)} processes; they save and stop at the step they "
          "agree on", file=sys.stderr, flush=True)  # fmt: skip


# multiprocessing's own helpers among the children: they train nothing (and ignore SIGTERM).
HELPERS = (b"multiprocessing.resource_tracker", b"multiprocessing.forkserver")


def _workers() -> list[int]:
    """The processes this one started (Linux /proc), but multiprocessing's helpers."""
    found = []
    for listed in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            for child in listed.read_text().split():
                try:
                    command = Path(f"/proc/{child}/cmdline").read_bytes()
                except OSError:  # gone already
                    continue
                if not any(helper in command for helper in HELPERS):
                    found.append(int(child))
    return found


class _Failed:
    """An expected error a process met, sent back to the launching process."""

    def __init__(self, error: ValueError) -> None:
        self.error = error


def _process_entry(strategy: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    try:
        strategy.start()
        result = fn(*args)
    except ValueError as error:  # every process meets it alike: no one waits for the others
        result = _Failed(error)
    runtime.leave_process_group()
    return result
