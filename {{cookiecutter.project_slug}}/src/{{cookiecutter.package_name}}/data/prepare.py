"""`prepare`: plan the shards of a corpus, run them on an engine, and write the manifest last.

Steps: resolve the inputs, plan the shards (a function of the data and the settings),
fingerprint both with every setting, reuse a prepared dataset of that fingerprint; else
claim the output (`prepare-plan.json`), skip the shards a stopped run already finished,
run the rest (`--engine local`: processes here; `--engine ray`: tasks on a cluster), and
write each split's index and the manifest from the shards' records. Nothing training
accepts exists before the manifest. Bad data removes what was written (a rerun would meet
it again); an interruption or a failed shard keeps the finished shards for the rerun.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from . import sources
from .encoding import TEXT, Tokenizer, mode_of
from .engines import ShardFailed, run_local, run_ray
from .finish import summed, write_indexes
from .manifest import (
    MANIFEST,
    PLAN,
    VERSION,
    DataError,
    Manifest,
    filesystem,
    join,
    read_manifest,
)
from .plan import Shard, plan, plan_rows, to_json
from .progress import Progress
from .raycluster import check_cluster
from .records import check_parquet_fields, detect_mode
from .shards import UPLOAD_BUFFER, Job, finished, is_local, remove_temporary

ENGINES = ("local", "ray")
MIN_UPLOAD_BUFFER = 256 << 10


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM: the shards already finished stay for the rerun; the message says so."""


@dataclass(frozen=True)
class Settings:
    """What shapes a prepared dataset, beside the inputs and the tokenizer; and what runs it."""

    seq_len: int
    field: str = "text"
    eval_fraction: float = 0.01
    num_proc: int = 0  # workers of either engine; 0: one per core (local), every CPU (ray)
    shard_size: int = 0  # input bytes per shard; 0: about 256 shards of 8 MiB to 512 MiB
    engine: str = "local"
    ray_address: str = ""
    upload_buffer: int = UPLOAD_BUFFER  # per remote window file a worker writes: see shards

    def check(self) -> None:
        if self.seq_len < 1:
            raise DataError(f"seq_len must be at least 1, got {self.seq_len}")
        if not 0.0 < self.eval_fraction < 1.0:
            raise DataError(f"eval_fraction must be between 0 and 1, got {self.eval_fraction}")
        if self.engine not in ENGINES:
            raise DataError(f"unknown engine {self.engine!r}: choose local or ray")
        if self.num_proc < 0 or self.shard_size < 0:
            raise DataError("--num-proc and --shard-size must not be negative")
        if self.upload_buffer < MIN_UPLOAD_BUFFER:
            raise DataError(
                f"--upload-buffer must be at least 256K (GCS takes uploads in parts of 256 KiB), "
                f"got {self.upload_buffer} bytes"
            )
        if self.engine == "ray" and not self.ray_address:
            raise DataError(
                "--engine ray needs a cluster: set RAY_ADDRESS or --ray-address to its head "
                "(make ray-up starts one on the pod's hosts)"
            )


def fingerprint(files: list[sources.InputFile], hub: str, tokenizer: Tokenizer, vocab: int,
                settings: Settings, shard_bytes: int) -> str:  # fmt: skip
    """A hash of the inputs (names, sizes, versions) and every setting that changes the output."""
    described = {
        "version": VERSION,
        "files": [[f.url, f.size, f.stamp] for f in files],
        "hub": hub,
        "tokenizer": tokenizer.identity,
        "vocab": vocab,
        "seq_len": settings.seq_len,
        "field": settings.field,
        "eval_fraction": settings.eval_fraction,
        "shard_bytes": shard_bytes,
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:32]


def prepare(
    inputs: list[str],
    out: str,
    tokenizer: Tokenizer,
    vocab_size: int,
    settings: Settings,
    echo: Callable[[str], None] = print,
) -> tuple[Manifest, bool]:
    """Prepare `inputs` into `out`; return the manifest and whether an earlier result was reused."""
    settings.check()
    if tokenizer.size > vocab_size:
        raise DataError(
            f"the tokenizer has {tokenizer.size} ids, more than the model's vocabulary of "
            f"{vocab_size}: use the model's own tokenizer"
        )
    hub = [item for item in inputs if item.startswith("hf:")]
    if hub and len(inputs) > 1:
        raise DataError("an hf: dataset is prepared on its own: give it as the only input")
    if hub and settings.engine == "ray":
        raise DataError("an hf: dataset is read on this machine: prepare it with --engine local")
    if settings.engine == "ray":
        check_cluster(settings.ray_address)  # before anything is written
    with _hub_scratch(bool(hub)) as scratch:
        raw = _load_hub(hub[0], scratch) if hub else None
        files = [] if hub else sources.resolve(inputs)
        if raw is not None:
            mode = mode_of(raw.column_names, settings.field)
            if mode == TEXT:
                sources.text_column(raw, settings.field, hub[0])
            shards, size = plan_rows(hub[0], len(raw), raw.data.nbytes, settings.shard_size)
        else:
            kind = sources.builder(files)
            where = ", ".join(f.url for f in files[:3]) + (" ..." if len(files) > 3 else "")
            if not any(f.size for f in files):
                raise DataError(f"{where} holds no documents: the corpus is empty")
            mode = detect_mode(files, kind, settings.field)
            if kind == "parquet":
                check_parquet_fields(files, mode, settings.field)
            shards, size = plan(files, settings.shard_size)
        print_ = fingerprint(files, hub[0] if hub else "", tokenizer, vocab_size, settings, size)
        existing = read_manifest(out)
        if existing is not None and existing.fingerprint == print_:
            return existing, True
        started = time.perf_counter()
        resumed = _claim(out, print_, shards, size)
        try:
            # Absolute: a Ray worker runs in a folder of its own.
            where_to = os.path.abspath(out.removeprefix("file://")) if is_local(out) else out
            job = Job(where_to, tokenizer, mode, settings.field, settings.seq_len, vocab_size,
                      settings.eval_fraction, raw, settings.upload_buffer)  # fmt: skip
            more = f" and {len(files) - 1} more" if len(files) > 1 else ""
            where = hub[0] if hub else files[0].url + more
            _run(job, shards, settings, echo, where, resumed)
            manifest, layout = summed(out, shards, tokenizer, vocab_size, settings.seq_len, print_)
        except DataError:
            _remove(out)  # the same inputs would fail the same way: leave nothing
            raise
    manifest.inputs = [f.url for f in files] or hub
    manifest.seconds = round(time.perf_counter() - started, 3)
    write_indexes(out, manifest, layout)
    fs, path = filesystem(out)
    fs.pipe(join(path, MANIFEST), manifest.to_json().encode())  # last: the dataset is whole
    return manifest, False


@contextmanager
def _hub_scratch(needed: bool) -> Iterator[str]:
    """A folder for a hub dataset's download, when there is one (nothing else is staged)."""
    if not needed:
        yield ""
        return
    with tempfile.TemporaryDirectory(prefix="prepare-hub-") as scratch:
        yield scratch


def _load_hub(name: str, scratch: str) -> Any:
    try:
        import datasets  # noqa: F401  (hub datasets come through it)
    except ImportError:
        raise DataError(sources.missing_datasets(name)) from None
    from pathlib import Path

    return sources.load_hub(name[3:], Path(scratch))


def _claim(out: str, print_: str, shards: list[Shard], size: int) -> bool:
    """Make `out` this dataset's, or find it already is (True: a stopped run to resume)."""
    fs, path = filesystem(out)
    refusal = (
        f"{out!r} already holds other data (another dataset, or one of other inputs or "
        "settings): choose another --out, or remove it first"
    )
    plan_path = join(path, PLAN)
    try:
        if fs.isfile(plan_path):
            if json.loads(fs.cat_file(plan_path)).get("fingerprint") != print_:
                raise DataError(refusal)
            return True
        if read_manifest(out) is not None or (
            fs.exists(path) and (not fs.isdir(path) or fs.ls(path, detail=False))
        ):
            raise DataError(refusal)
    except (OSError, ValueError) as error:
        if isinstance(error, DataError):
            raise
        raise DataError(f"cannot use --out {out}: {error}") from None
    fs.makedirs(path, exist_ok=True)
    described = {"fingerprint": print_, "shard_bytes": size, "shards": to_json(shards)}
    fs.pipe(plan_path, json.dumps(described).encode())
    return False


def _run(job: Job, shards: list[Shard], settings: Settings, echo: Callable[[str], None],
         where: str, resumed: bool) -> None:  # fmt: skip
    remove_temporary(job.out)
    done = set(finished(job.out))
    todo = [shard for shard in shards if shard.index not in done]
    echo(
        f"{len(shards)} shards ({job.mode}) from {where}"
        + (f"; resuming: {len(shards) - len(todo)} already written" if resumed else "")
    )
    progress = Progress(len(shards), len(shards) - len(todo), sum(s.size for s in todo), echo)
    sizes = {shard.index: shard.size for shard in shards}
    nodes = set()

    def finished_one(record: dict[str, Any]) -> None:
        progress(record, sizes[record["shard"]])
        nodes.add(record.get("node", "here"))

    try:
        with _interrupt_on_sigterm():
            if settings.engine == "ray":
                run_ray(job, todo, settings.num_proc, settings.ray_address, finished_one)
            else:
                run_local(job, todo, settings.num_proc, finished_one)
    except KeyboardInterrupt:
        raise Interrupted(
            f"interrupted: {progress.done} of {len(shards)} shards are written in {job.out}; "
            "the same command finishes the rest"
        ) from None
    except ShardFailed as error:
        raise ShardFailed(
            f"{error}; {progress.done} of {len(shards)} shards are written in {job.out}: the "
            "same command finishes the rest"
        ) from None
    finally:
        progress.close()
    where = f" on {len(nodes)} Ray node{'s' * (len(nodes) > 1)}" if settings.engine == "ray" else ""
    echo(f"{len(todo)} shards tokenized{where}, {len(shards) - len(todo)} reused")


def _remove(out: str) -> None:
    fs, path = filesystem(out)
    try:
        if fs.exists(path):
            fs.rm(path, recursive=True)
    except OSError:
        pass


@contextmanager
def _interrupt_on_sigterm() -> Iterator[None]:
    """SIGTERM ends `prepare` like Ctrl-C: the workers stop, the finished shards stay."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
