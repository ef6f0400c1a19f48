"""Corpora at any size: prepared once (read, tokenized, packed, split, written), read by index.

`prepare` turns text, JSON lines or Parquet files (local paths, globs or `gs://` URLs) into a
prepared dataset: fixed windows of `seq_len + 1` token ids in Arrow files, one per shard of a
plan fixed by the data (`plan`), each shard read streaming, tokenized and packed on its own
(`shards`) by local processes or Ray tasks (`engines`), with a manifest (`prepared.json`)
written last (`finish`). Training reads each window at its offset in those files, by its
index, in place (`reading`, `readahead` for gs://), so a corpus of any size costs the same
host memory and no local disk. Not torch_xla-specific.
"""

from __future__ import annotations

from .manifest import MANIFEST, DataError, Manifest, is_prepared

__all__ = ["MANIFEST", "DataError", "Manifest", "is_prepared"]
