"""Where a corpus comes from: local paths, globs, `gs://` URLs (any fsspec URL) or `hf:NAME`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .manifest import DataError, filesystem

# File extensions and the `datasets` builder that reads them.
BUILDERS = {
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".jsonl": "json",
    ".json": "json",
    ".ndjson": "json",
    ".parquet": "parquet",
}
RECORD_FORMATS = ("json", "parquet")  # raw bytes of these mean nothing to a model
TEXT_TYPES = ("string", "large_string")
GLOB_CHARS = "*?["
# A folder holding one of these is a prepared dataset (or one being written): never a corpus.
DATASET_MARKERS = ("prepared.json", "prepare-plan.json")


@dataclass(frozen=True)
class InputFile:
    """One input file: its path or URL, and what identifies this version of it."""

    url: str
    size: int
    stamp: str  # modification time, or the object's generation or etag


def builder_of(path: str) -> str | None:
    """The `datasets` builder for a file name, or None when its extension is not known."""
    return BUILDERS.get(os.path.splitext(path.rstrip("/"))[1].lower())


def _protocol(fs: Any) -> str:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return "" if protocol in ("file", "local") else f"{protocol}://"


def _stamp(info: dict[str, Any]) -> str:
    for key in ("generation", "etag", "md5Hash", "mtime", "updated", "LastModified"):
        if info.get(key) is not None:
            return str(info[key])
    return ""


def resolve(inputs: list[str]) -> list[InputFile]:
    """Every file the inputs name (a folder: the known files under it), sorted and checked."""
    files: dict[str, InputFile] = {}
    for item in inputs:
        fs, path = filesystem(item)
        prefix = _protocol(fs)
        if any(char in item for char in GLOB_CHARS):
            found = sorted(p for p in fs.glob(path) if fs.isfile(p))
            if not found:
                raise DataError(f"no file matches {item!r}")
        elif fs.isdir(path):
            found = _corpus_files(fs.find(path))
            if not found:
                raise DataError(
                    f"{item!r} holds no .txt, .jsonl, .json or .parquet file to prepare"
                )
        elif fs.isfile(path):
            found = [path]
        else:
            raise DataError(f"{item!r} does not exist")
        for found_path in found:
            if builder_of(found_path) is None:
                raise DataError(
                    f"{prefix + found_path!r} is not a corpus file: use .txt, .jsonl, .json or "
                    ".parquet"
                )
            info = fs.info(found_path)
            url = prefix + found_path
            files[url] = InputFile(url, int(info.get("size") or 0), _stamp(info))
    return sorted(files.values(), key=lambda f: f.url)


def _corpus_files(paths: list[str]) -> list[str]:
    """The known corpus files among `paths`, less those of prepared datasets among them."""
    roots = [os.path.dirname(p) + "/" for p in paths if os.path.basename(p) in DATASET_MARKERS]
    return sorted(p for p in paths if builder_of(p) and not any(p.startswith(r) for r in roots))


def builder(files: list[InputFile]) -> str:
    """The one builder that reads every file (mixed formats are prepared separately)."""
    kinds = {builder_of(f.url) for f in files}
    if len(kinds) != 1:
        raise DataError(
            f"the inputs mix formats ({', '.join(sorted(str(k) for k in kinds))}): "
            "prepare each format separately"
        )
    return str(kinds.pop())


def load_hub(name: str, cache_dir: Path) -> Any:
    """`hf:NAME[:CONFIG]`: a dataset from the Hugging Face hub (needs network access)."""
    from datasets import load_dataset

    repo, _, config = name.partition(":")
    try:
        return load_dataset(repo, config or None, split="train", cache_dir=str(cache_dir))
    except Exception as error:
        message = (str(error).strip() or type(error).__name__).splitlines()[0][:300]
        raise DataError(f"cannot load hf:{name}: {message}") from None


def missing_datasets(what: str) -> str:
    return (
        f"{what} needs the `datasets` package, which is not installed: "
        "pip install 'datasets>=5.2,<6' (or reinstall the project: pip install -e .)"
    )


def text_column(dataset: Any, column: str, where: str) -> None:
    """Refuse a text column that is not there, or not text."""
    features = dataset.features
    if column not in features:
        have = ", ".join(sorted(features)) or "none"
        raise DataError(
            f"{where} has no field {column!r} (its fields: {have}): name the text field "
            "with --field"
        )
    dtype = getattr(features[column], "dtype", type(features[column]).__name__)
    if dtype not in TEXT_TYPES:
        raise DataError(f"field {column!r} of {where} holds {dtype}, not text")
