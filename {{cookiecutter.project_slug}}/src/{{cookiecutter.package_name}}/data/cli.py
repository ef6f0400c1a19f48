"""The `prepare` command: the task's tokenizer and sequence length, from the run's config."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from .encoding import BYTE_VOCAB, Tokenizer
from .manifest import DataError

INPUTS_HELP = "Files, folders, globs or gs:// URLs of .txt, .jsonl/.json or .parquet; or hf:NAME."


def task_tokenizer(task: Any) -> tuple[Tokenizer, int]:
    """The task's tokenizer (its `tokenizer`, a Hugging Face one; None: bytes), and its model's
    vocabulary size (`vocab_size`; bytes: 256)."""
    tokenizer = Tokenizer(getattr(task, "tokenizer", None))
    return tokenizer, int(getattr(task, "vocab_size", None) or tokenizer.size or BYTE_VOCAB)


def parse_size(text: str, option: str = "--shard-size") -> int:
    """Bytes from `4096`, `64K`, `64M` or `1G`."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    number, unit = (text[:-1], text[-1].upper()) if text[-1:].upper() in units else (text, "")
    try:
        return int(float(number) * units.get(unit, 1))
    except ValueError:
        raise DataError(f"{option} {text!r} is not a size: write 64M, 1G or bytes") from None


def prepare_command(
    inputs: Annotated[list[str], typer.Argument(help=INPUTS_HELP, show_default=False)],
    out: Annotated[str, typer.Option(help="The prepared dataset: a new folder or gs:// URL.")],
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="The run's config: task, seq_len.")
    ] = None,
    field: Annotated[str, typer.Option(help="The text field of JSON records / Parquet.")] = "text",
    eval_fraction: Annotated[float, typer.Option(help="Share of documents held out.")] = 0.01,
    num_proc: Annotated[
        int, typer.Option(help="Workers of either engine (0: one per core; ray: every CPU).")
    ] = 0,
    engine: Annotated[
        str, typer.Option(help="local: processes here; ray: tasks on the cluster at RAY_ADDRESS.")
    ] = "local",
    ray_address: Annotated[
        str, typer.Option(envvar="RAY_ADDRESS", help="The Ray cluster's head (HOST:PORT).")
    ] = "",
    shard_size: Annotated[
        str, typer.Option(help="Input bytes per shard (64M, 1G; 0: about 256 shards).")
    ] = "0",
    upload_buffer: Annotated[
        str, typer.Option(help="Into gs://: memory per window file a worker writes (>= 256K).")
    ] = "16M",
    sets: Annotated[
        list[str] | None, typer.Option("--set", "-s", help="Override a config key: key=value.")
    ] = None,
) -> None:
    """Tokenize, pack and split a corpus once, for `train --data OUT` (any size, local or gs://)."""
    from ..cli_common import fail, resolve_config
    from .engines import ShardFailed
    from .prepare import Settings, prepare
    from .raycluster import check_cluster

    cfg = resolve_config(config, sets, {})
    try:
        if engine == "ray" and ray_address:  # refused before the task (and torch) loads
            check_cluster(ray_address)
        from ..tasks import load_task

        task = load_task(cfg.task, "", cfg.task_options)  # its tokenizer, not its data
        tokenizer, vocab = task_tokenizer(task)
        seq_len = int(getattr(task, "seq_len", 0) or cfg.task_options.get("seq_len", 0))
        settings = Settings(
            seq_len, field, eval_fraction, num_proc, parse_size(shard_size), engine, ray_address,
            parse_size(upload_buffer, "--upload-buffer"),
        )  # fmt: skip
        manifest, reused = prepare(inputs, out, tokenizer, vocab, settings, typer.echo)
    except KeyboardInterrupt as stop:
        fail(str(stop) or "interrupted: nothing was written", 130)
    except ShardFailed as error:
        fail(str(error), 1)
    except (DataError, ValueError, OSError) as error:
        fail(str(error))
    if reused:
        typer.echo(f"up to date: {out} was prepared from these inputs with these settings")
    typer.echo(f"prepared {out}: {manifest.summary()}")
    typer.echo(f"train with: --data {out}")
