"""Where a run's figures go besides the terminal: TensorBoard events, a Weights & Biases run.

Every logger gets the host numbers the loop has already read, at the loop's cadence: none
reads the device. `loggers` in the config names them (`["tensorboard"]` by default);
`wandb` is an optional extra, imported only when named. The W&B run's id is kept beside the
checkpoints (`<checkpoint_dir>-records/wandb.json`, through the records' storage, gs://
included), so a run that resumes (`resume` set: a relaunch after a preemption, a supervisor)
continues the same W&B run instead of starting one per attempt.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..exit_codes import EXIT_OF_STATUS
from ..goodput import store
from .errors import ConfigError

LOGGERS = ("tensorboard", "wandb")
WANDB_OPTIONS = ("project", "entity", "name", "tags", "group", "mode")
WANDB_MODES = ("online", "offline")
WANDB_MISSING = "loggers names \"wandb\", which needs the wandb package: pip install -e '.[wandb]'"
RUN_ID = "wandb.json"  # in the records folder beside the checkpoints
# The x-axis of every W&B chart: the training step. W&B's own `_step` counts log calls, and
# a resumed run trains again the steps after its last checkpoint.
STEP = "step"
# Left out of the W&B summary: the per-step list is the run's history there already.
NOT_SUMMARISED = ("train_losses",)


def check(loggers: list[Any], options: dict[str, Any]) -> None:
    """Raise ConfigError for a logger or W&B option no run can use, or a missing wandb."""
    unknown = [name for name in loggers if name not in LOGGERS]
    if unknown:
        raise ConfigError(f"unknown logger {unknown[0]!r}: use {', '.join(LOGGERS)}")
    extra = sorted(set(options) - set(WANDB_OPTIONS))
    if extra:
        raise ConfigError(f"unknown wandb option {extra[0]!r}: use {', '.join(WANDB_OPTIONS)}")
    for key in ("project", "entity", "name", "group"):
        if key in options and not isinstance(options[key], str):
            raise ConfigError(f"wandb.{key} must be text, got {options[key]!r}")
    tags = options.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
        raise ConfigError(f'wandb.tags must be a list of text (["a", "b"]), got {tags!r}')
    if options.get("mode", "online") not in WANDB_MODES:
        raise ConfigError(f"wandb.mode must be online or offline, got {options['mode']!r}")
    if "wandb" in loggers and not installed("wandb"):
        raise ConfigError(WANDB_MISSING)


def installed(module: str) -> bool:
    if module in sys.modules:  # None there: its import is blocked
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


def open_loggers(config: Any, run_dir: Path, checkpoint_dir: str) -> list[Any]:
    """The loggers `config.loggers` names, opened (the master process only)."""
    opened: list[Any] = []
    for name in dict.fromkeys(config.loggers):
        if name == "tensorboard":
            opened.append(TensorBoard(run_dir))
        else:
            records = store.records_location(checkpoint_dir)
            opened.append(WandbRun(run_dir, config, records))
    return opened


class TensorBoard:
    """Scalars as TensorBoard events in `run_dir/tensorboard`."""

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tensorboard"))
        # A run that fails keeps its curves up to the failure: the events still queued are
        # written, and the writer's thread ends, before the interpreter does.
        atexit.register(self.writer.close)

    def scalars(self, step: int, values: dict[str, float], prefix: str) -> None:
        for key, value in values.items():
            self.writer.add_scalar(f"{prefix}/{key}", value, step)

    def line(self, text: str) -> None:
        pass  # the terminal has it

    def summary(self, data: dict[str, Any]) -> None:
        self.writer.close()


class WandbRun:
    """A W&B run: the config at its start, the scalars against the training step, the report
    lines and the closing summary in its summary; its files in `run_dir/wandb`.

    W&B's own calls (each a few milliseconds of Python) run on a thread of their own, in the
    order the loop made them: the loop's thread, which a TPU waits on, only hands them over.
    The summary waits for them, and a call that failed stops the run at its next one."""

    def __init__(self, run_dir: Path, config: Any, records: str) -> None:
        import wandb

        options = dict(config.wandb)
        # A run that resumes continues the W&B run its records name; a fresh one starts anew.
        kept = _read_id(records) if config.resume else None
        try:
            self.run = wandb.init(
                dir=str(run_dir), id=kept, resume="allow" if kept else None,
                config=config.to_dict(), allow_val_change=True, **options,
            )  # fmt: skip
        except wandb.errors.Error as error:
            reason = (str(error).strip() or type(error).__name__).splitlines()[0]
            raise ConfigError(
                f"W&B could not start the run ({reason}): on the host that logs (worker 0), "
                "`wandb login` or set WANDB_API_KEY; or log offline with "
                "--set wandb.mode=offline and `wandb sync` later"
            ) from None
        if self.run.id != kept:
            _write_id(records, {"id": self.run.id, "project": self.run.project})
        self.run.define_metric(STEP)
        self.run.define_metric("*", step_metric=STEP)
        self.lines: list[str] = []
        self.calls = ThreadPoolExecutor(1, thread_name_prefix="wandb")
        self.failed: BaseException | None = None

    def _later(self, call: Callable[..., Any], *args: Any) -> None:
        if self.failed is not None:
            raise self.failed
        self.calls.submit(call, *args).add_done_callback(self._check)

    def _check(self, done: Future[Any]) -> None:
        if self.failed is None and done.exception() is not None:
            self.failed = done.exception()

    def scalars(self, step: int, values: dict[str, float], prefix: str) -> None:
        logged = {STEP: step, **{f"{prefix}/{key}": value for key, value in values.items()}}
        self._later(self.run.log, logged)

    def line(self, text: str) -> None:
        self.lines.append(text)
        self._later(self.run.summary.__setitem__, "report", list(self.lines))

    def summary(self, data: dict[str, Any]) -> None:
        """The run's summary, with the goodput of every attempt so far; then finish."""
        self.calls.shutdown(wait=True)
        if self.failed is not None:
            _note(f"a W&B call failed, the run's history may lack figures: {self.failed}")
        self.run.summary.update({k: v for k, v in data.items() if k not in NOT_SUMMARISED})
        whole = _goodput(data.get("records") or {})
        if whole is not None:
            self.run.summary["goodput"] = whole
        self.run.finish(exit_code=EXIT_OF_STATUS.get(data.get("status", ""), 1))


def _read_id(records: str) -> str | None:
    try:
        text = store.read_text(records, RUN_ID)
        return None if text is None else str(json.loads(text)["id"])
    except Exception as error:  # fsspec and gcsfs raise many types; a bad file is a new run
        _note(f"W&B run id not read from {records}/{RUN_ID} ({error}): a new W&B run starts")
        return None


def _write_id(records: str, kept: dict[str, Any]) -> None:
    try:
        store.write_text(records, RUN_ID, json.dumps(kept) + "\n")
    except Exception as error:  # the run is worth more than its W&B id: said, not raised
        _note(f"W&B run id not written to {records}/{RUN_ID} ({error}): a resumed run will "
              "start a new W&B run")  # fmt: skip


def _goodput(records: dict[str, Any]) -> dict[str, Any] | None:
    """The goodput account of every attempt so far (the W&B run spans them), if kept."""
    from ..goodput import account

    if not records or not account.available():
        return None
    try:
        return account.account(store.read_events(records["location"]))
    except Exception:  # the end of the run prints the reason with its own account
        return None


def _note(text: str) -> None:
    print(f"wandb: {text.splitlines()[0][:300]}", file=sys.stderr)
