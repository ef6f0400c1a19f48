"""The prepared dataset's last files, from the shards' records: the manifest's counts, each
split's `index.json` (where every window lies, so a reader opens no file to find it) and the
files `datasets.load_from_disk` reads."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from .encoding import Tokenizer
from .manifest import INDEX, SPLITS, DataError, Manifest, filesystem, join
from .packing import TOKEN_COLUMNS, decode_counts, entropy
from .plan import Shard
from .shards import finished, read_records


def summed(out: str, shards: list[Shard], tokenizer: Tokenizer, vocab: int, seq_len: int,
           print_: str) -> tuple[Manifest, dict[str, list[Any]]]:  # fmt: skip
    """The manifest and each split's file layout from every shard's record, or the DataError
    of a corpus that fills no window."""
    paths = finished(out)
    missing = [shard.describe() for shard in shards if shard.index not in paths]
    if missing:
        raise DataError(f"{missing[0]} left no record in {out}: run prepare again")
    records = read_records(out, [paths[shard.index] for shard in shards])
    documents = sum(r["documents"] for r in records)
    tokens = sum(r["tokens"] for r in records)
    if documents == 0:
        raise DataError(f"{out}: the corpus holds no documents")
    if tokens == documents:
        raise DataError("the corpus holds no text: every document is empty")
    sequences = {split: sum(r["sequences"][split] for r in records) for split in SPLITS}
    for split in SPLITS:
        if sequences[split] == 0:
            raise DataError(
                f"the {split} split fills no sequence of {seq_len + 1} tokens "
                f"({tokens:,} tokens in all): "
                + ("raise --eval-fraction" if split == "eval" else "give more text")
                + " or lower seq_len"
            )
    counts = np.zeros(vocab, np.int64)
    for record in records:
        counts += decode_counts(record["counts"], vocab)
    manifest = Manifest(
        seq_len=seq_len,
        tokenizer=tokenizer.identity,
        eod_id=tokenizer.eod_id,
        vocab_size=vocab,
        fingerprint=print_,
        masked=bool(records[0]["masked"]),
        documents=documents,
        tokens=tokens,
        sequences=sequences,
        dropped_tokens=sum(r["dropped_tokens"] for r in records),
        loss_tokens=sum(r["loss_tokens"] for r in records),
        unigram_entropy=entropy(counts),
        shards=len(records),
    )
    return manifest, {split: [r["layout"][split] for r in records] for split in SPLITS}


def write_indexes(out: str, manifest: Manifest, layout: dict[str, list[Any]]) -> None:
    """Each split's `index.json` (where every window lies) and the files that let
    `datasets.load_from_disk` open it."""
    fs, path = filesystem(out)
    for split in SPLITS:
        names = [f"shard-{i:05d}.arrow" for i in range(manifest.shards)]
        chunks = zip(names, layout[split], strict=True)
        written = {
            INDEX: {"files": [{"name": name, "chunks": c} for name, c in chunks]},
            **_datasets_files(names, manifest, split),
        }
        for name, content in written.items():
            fs.pipe(join(path, split, name), json.dumps(content, indent=2).encode())


def _datasets_files(names: list[str], manifest: Manifest, split: str) -> dict[str, Any]:
    """`state.json` and `dataset_info.json`, as `datasets.Dataset.save_to_disk` writes them."""
    columns = TOKEN_COLUMNS if manifest.masked else TOKEN_COLUMNS[:1]
    window = {"dtype": "int32", "_type": "Value"}
    features = {
        name: {"feature": window, "length": manifest.seq_len + 1, "_type": "List"}
        for name in columns
    }
    state: dict[str, Any] = {
        "_data_files": [{"filename": name} for name in names],
        "_fingerprint": f"{manifest.fingerprint[:16]}{split}",
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    info = {"citation": "", "description": "", "features": features, "homepage": "", "license": ""}
    return {"state.json": state, "dataset_info.json": info}
