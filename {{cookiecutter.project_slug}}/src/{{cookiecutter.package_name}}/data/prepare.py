"""`prepare`: read, tokenize in parallel, pack, split and write a corpus, once.

Steps: resolve the inputs, fingerprint them with every setting, reuse a prepared dataset of
that fingerprint; else read them with `datasets` (memory-mapped Arrow), tokenize with
`num_proc` processes, pack in one sequential pass, and write `train/` and `eval/`
(`datasets.save_to_disk` layout, local or `gs://`), the manifest last. A local output is
built in a sibling folder and renamed into place; a failed or interrupted run removes what
it wrote, and anything left without a manifest is refused by training.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import sources
from .encoding import CHAT, PROMPT_COMPLETION, TEXT, Encoder, Tokenizer, mode_of
from .manifest import (
    MANIFEST,
    SPLITS,
    VERSION,
    DataError,
    Manifest,
    filesystem,
    join,
    read_manifest,
)
from .packing import pack


@dataclass(frozen=True)
class Settings:
    """What shapes a prepared dataset, beside the inputs and the tokenizer."""

    seq_len: int
    field: str = "text"
    eval_fraction: float = 0.01
    num_proc: int = 0  # 0: one process per core

    def check(self) -> None:
        if self.seq_len < 1:
            raise DataError(f"seq_len must be at least 1, got {self.seq_len}")
        if not 0.0 < self.eval_fraction < 1.0:
            raise DataError(f"eval_fraction must be between 0 and 1, got {self.eval_fraction}")


def fingerprint(files: list[sources.InputFile], hub: str, tokenizer: Tokenizer, vocab: int,
                settings: Settings) -> str:  # fmt: skip
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
    try:
        import datasets  # noqa: F401  (read, tokenize and write through it)
    except ImportError:
        raise DataError(sources.missing_datasets(hub[0] if hub else "prepare")) from None
    files = [] if hub else sources.resolve(inputs)
    kind = sources.builder(files) if files else "hub"
    print_fingerprint = fingerprint(files, hub[0] if hub else "", tokenizer, vocab_size, settings)
    existing = read_manifest(out)
    if existing is not None and existing.fingerprint == print_fingerprint:
        return existing, True
    if existing is not None or _holds_files(out):
        raise DataError(
            f"{out!r} already holds other data (other inputs or settings): choose another "
            "--out, or remove it first"
        )
    started = time.perf_counter()
    _quiet_unless_interactive()
    with _staging(out) as (stage, scratch), _interrupt_on_sigterm():
        raw = (
            sources.load_hub(hub[0][3:], scratch)
            if hub
            else sources.load(sources.local_copies(files, scratch), kind, scratch / "hf-cache")
        )
        where = ", ".join(f.url for f in files[:3]) + (" ..." if len(files) > 3 else "") or hub[0]
        mode = mode_of(raw.column_names, settings.field)
        if mode == TEXT:
            sources.text_column(raw, settings.field, where)
        if len(raw) == 0:
            raise DataError(f"{where} holds no documents: the corpus is empty")
        echo(f"{len(raw):,} documents ({mode}) from {where}")
        tokenized = _tokenize(raw, tokenizer, mode, settings)
        from tqdm.auto import tqdm

        with tqdm(total=len(tokenized), desc="Packing", unit=" docs", disable=None) as bar:
            packed = pack(tokenized, scratch, settings.seq_len, vocab_size, bar)
        if packed["tokens"] == packed["documents"]:
            raise DataError(f"{where} holds no text: every document is empty")
        for split in SPLITS:
            if packed["sequences"][split] == 0:
                raise DataError(
                    f"the {split} split fills no sequence of {settings.seq_len + 1} tokens "
                    f"({packed['tokens']:,} tokens in all): "
                    + ("raise --eval-fraction" if split == "eval" else "give more text")
                    + " or lower seq_len"
                )
        _write_splits(scratch, stage)
        manifest = Manifest(
            seq_len=settings.seq_len,
            tokenizer=tokenizer.identity,
            eod_id=tokenizer.eod_id,
            vocab_size=vocab_size,
            fingerprint=print_fingerprint,
            inputs=[f.url for f in files] or hub,
            seconds=round(time.perf_counter() - started, 3),
            **packed,
        )
        fs, path = filesystem(stage)
        fs.pipe(join(path, MANIFEST), manifest.to_json().encode())  # last: the dataset is whole
    return manifest, False


def _quiet_unless_interactive() -> None:
    """Progress bars on a terminal; in logs and pipes only the lines that say something."""
    import datasets

    if sys.stderr.isatty():
        datasets.enable_progress_bars()
    else:
        datasets.disable_progress_bars()


def _tokenize(raw: Any, tokenizer: Tokenizer, mode: str, settings: Settings) -> Any:
    from datasets import Features, Sequence, Value

    columns: dict[str, Any] = {"held_out": Value("bool"), "ids": Sequence(Value("int32"))}
    if mode in (PROMPT_COMPLETION, CHAT):
        columns["labels"] = Sequence(Value("int32"))
    procs = settings.num_proc or os.cpu_count() or 1
    encoder = Encoder(tokenizer, mode, settings.field, settings.eval_fraction)
    return raw.map(
        encoder,
        batched=True,
        with_indices=True,
        remove_columns=raw.column_names,
        features=Features(columns),
        num_proc=procs if len(raw) >= 1000 * procs and procs > 1 else None,
        desc="Tokenizing",
    )


def _write_splits(scratch: Path, stage: str) -> None:
    """Each split's windows in the `datasets.save_to_disk` layout, local or remote.

    In record batches of up to datasets' 100 MB row groups rather than its 1,000 rows: a
    reader maps each batch's header, and thousands of them would cost time and page cache.
    """
    import datasets
    from datasets import Dataset

    rows, datasets.config.DEFAULT_MAX_BATCH_SIZE = datasets.config.DEFAULT_MAX_BATCH_SIZE, 1 << 30
    try:
        for split in SPLITS:
            windows = Dataset.from_file(str(scratch / f"{split}.arrow"))
            windows.save_to_disk(join(stage, split), max_shard_size="500MB")
    finally:
        datasets.config.DEFAULT_MAX_BATCH_SIZE = rows


def _holds_files(location: str) -> bool:
    fs, path = filesystem(location)
    try:
        return bool(fs.exists(path) and (not fs.isdir(path) or fs.ls(path, detail=False)))
    except OSError:
        return False


@contextmanager
def _staging(out: str) -> Iterator[tuple[str, Path]]:
    """Where the dataset is built, and a local scratch folder; nothing is left on failure."""
    remote = "://" in out
    if not remote:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
    stage = out if remote else tempfile.mkdtemp(prefix=".partial-", dir=Path(out).parent)
    scratch = Path(tempfile.mkdtemp(prefix="prepare-", dir=None if remote else stage))
    try:
        yield stage, scratch
        shutil.rmtree(scratch, ignore_errors=True)
        if not remote:
            if Path(out).is_dir():
                Path(out).rmdir()  # an empty folder: nothing of value is replaced
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(stage, 0o777 & ~umask)  # mkdtemp's 0700 is for the work in progress
            os.replace(stage, out)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        if remote:
            fs, path = filesystem(out)
            if fs.exists(path):
                fs.rm(path, recursive=True)
        else:
            shutil.rmtree(stage, ignore_errors=True)
        raise


@contextmanager
def _interrupt_on_sigterm() -> Iterator[None]:
    """SIGTERM ends `prepare` like Ctrl-C: through the clean-up, not around it."""

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
