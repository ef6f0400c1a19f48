"""Corpora written by the tests themselves (no download), and prepared datasets of them."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]


def documents(count: int, seed: int = 0, words: tuple[int, int] = (1, 40)) -> list[str]:
    """Sentences of random words: a corpus with structure a small model can learn."""
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(*words))) + "." for _ in range(count)
    ]


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def write_parquet(path: Path, columns: dict[str, list[Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def corpus_jsonl(folder: Path, count: int = 400, seed: int = 0) -> Path:
    """JSON lines of `{"text": ..., "id": ...}` records."""
    texts = documents(count, seed)
    return write_jsonl(folder / "corpus.jsonl", [{"text": t, "id": i} for i, t in enumerate(texts)])


def prompt_completion_jsonl(folder: Path, count: int = 300, seed: int = 0) -> Path:
    """Prompts in capitals joined by `_`, completions in small letters and spaces: a target's
    byte tells its part."""
    rng = random.Random(seed)
    records = []
    for _ in range(count):
        prompt = "_".join(rng.choice(WORDS).upper() for _ in range(rng.randint(2, 12)))
        completion = " " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))
        records.append({"prompt": prompt, "completion": completion})
    return write_jsonl(folder / "pairs.jsonl", records)


def read_windows(folder: Path, split: str = "train") -> dict[str, list[list[int]]]:
    """Every window of a prepared split, as lists of ids (and labels when masked)."""
    from datasets import load_from_disk

    rows = load_from_disk(str(folder / split))
    return {name: list(rows[name]) for name in rows.column_names}


def manifest(folder: Path) -> dict[str, Any]:
    return dict(json.loads((folder / "prepared.json").read_text()))


def short_documents_jsonl(folder: Path, count: int = 200, seed: int = 1) -> Path:
    """Documents of a few words: a window of 128 tokens holds several of them."""
    texts = documents(count, seed, words=(2, 9))
    return write_jsonl(folder / "short.jsonl", [{"text": t} for t in texts])


def window_with_documents(dataset: Any, least: int = 4) -> dict[str, Any]:
    """The first sample of a prepared split whose window holds at least `least` documents."""
    from {{ cookiecutter.package_name }}.core.attention import document_segments

    for index in range(len(dataset)):
        sample = dataset[index]
        if int(document_segments(sample["positions"][None]).max()) + 1 >= least:
            return dict(sample)
    raise AssertionError(f"no window holds {least} documents")


def document_spans(positions: Any) -> list[tuple[int, int]]:
    """(start, end) of each document in a window's inputs, from their positions."""
    from {{ cookiecutter.package_name }}.core.attention import document_segments

    segments = document_segments(positions[None])[0].tolist()
    starts = [i for i, s in enumerate(segments) if i == 0 or s != segments[i - 1]]
    return list(zip(starts, [*starts[1:], len(segments)], strict=True))
