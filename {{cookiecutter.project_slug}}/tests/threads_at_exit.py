"""Copied into the tests' gated sources as `sitecustomize`, so imported at start-up: at the
very end of the process, it names the threads still running, each with the module of its
code.

Python's exit cuts off the daemon threads still running; one cut off inside C++ code (while
torch_xla moves a batch to the device) aborts the process after it printed its result
("terminate called without an active exception", exit -6). The threads of torch, torch_xla
and this project must be gone by then; libraries' service threads idling in I/O (fsspec's
event loop, W&B's) are cut off harmlessly.
"""

import atexit
import sys
import threading

LEFT = "threads left at exit:"


def module_of(thread: threading.Thread) -> str:
    code = getattr(thread, "_target", None) or type(thread).run
    return getattr(code, "__module__", None) or "?"


def _name_the_threads_left() -> None:
    main = threading.main_thread()
    left = [f"{t.name} [{module_of(t)}]" for t in threading.enumerate() if t is not main]
    print(LEFT, "; ".join(sorted(left)) or "none", file=sys.stderr, flush=True)


if __name__ == "sitecustomize":  # not where the tests import LEFT
    atexit.register(_name_the_threads_left)  # the first registered: the last to run
