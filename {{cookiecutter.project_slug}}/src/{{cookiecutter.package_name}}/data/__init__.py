"""Corpora at any size: prepared once (read, tokenized, packed, split, written), read by index.

`prepare` turns text, JSON lines or Parquet files (local paths, globs or `gs://` URLs) into a
prepared dataset: fixed windows of `seq_len + 1` token ids in Arrow files, with a manifest
(`prepared.json`) written last. Training reads each window at its offset in those files, by
its index, so a corpus of any size costs the same host memory. Not torch_xla-specific.
"""

from __future__ import annotations

from .manifest import MANIFEST, DataError, Manifest, is_prepared

__all__ = ["MANIFEST", "DataError", "Manifest", "is_prepared"]
