"""Corpora written by the tests themselves (no download), prepared datasets of them, and the
processes of their own that `prepare` and Ray run in during the tests."""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from training_helpers import cli_env

TESTS = Path(__file__).resolve().parent
# A `prepare` that hangs fails its test after this long, and the session goes on.
APART_TIMEOUT = 600
RAY_START_TIMEOUT, RAY_STOP_TIMEOUT = 300, 120

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


def dataset_files(out: Path) -> dict[str, bytes]:
    """Every window file and split index of a prepared dataset, by name."""
    found = [*out.glob("*/shard-*.arrow"), *out.glob("*/*.json")]
    return {str(p.relative_to(out)): p.read_bytes() for p in found}


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


def run_apart(argv: list[str], env: dict[str, str] | None = None,
              timeout: float = APART_TIMEOUT) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`python *argv` in a process group of its own (the tests' helpers importable): its
    output, or a failed test once `timeout` passes (the group, workers too, killed)."""
    env = {**(env or cli_env())}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    process = subprocess.Popen(
        [sys.executable, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"{argv[:4]} did not finish within {timeout:.0f} s:\n{(out + err)[-3000:]}")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def prepare_apart(
    inputs: list[Any],
    out: Path | str,
    echo: Any = None,
    env: dict[str, str] | None = None,
    **settings: Any,
) -> tuple[Any, bool]:
    """`prepare` through its Python API (bytes, a vocabulary of 256), as a script calls it,
    in a fresh interpreter (`run_apart`): the manifest and whether it was reused. Its
    DataError is raised here; what it echoed goes to `echo`."""
    from {{ cookiecutter.package_name }}.data.manifest import DataError, Manifest

    request = json.dumps({"inputs": [str(p) for p in inputs], "out": str(out), **settings})
    result = run_apart(["-c", PREPARE_HERE, request], env)
    *lines, last = result.stdout.splitlines() or [""]
    if result.returncode != 0 or not last.startswith("{"):
        output = (result.stdout + result.stderr)[-3000:]
        pytest.fail(f"prepare exited {result.returncode}:\n{output}")
    for line in lines:
        (echo or print)(line)
    answer = json.loads(last)
    if "error" in answer:
        raise DataError(answer["error"])
    return Manifest.from_dict(answer["manifest"]), bool(answer["reused"])


# The other end of `prepare_apart` (the package alone imported): the request in argv, the
# answer as the last line.
PREPARE_HERE = """
import json, sys
from {{ cookiecutter.package_name }}.data.encoding import Tokenizer
from {{ cookiecutter.package_name }}.data.manifest import DataError
from {{ cookiecutter.package_name }}.data.prepare import Settings, prepare

request = json.loads(sys.argv[1])
inputs, out = request.pop("inputs"), request.pop("out")
try:
    made, reused = prepare(inputs, out, Tokenizer(), 256, Settings(**request), print)
except DataError as error:
    print(json.dumps({"error": str(error)}))
else:
    print(json.dumps({"manifest": json.loads(made.to_json()), "reused": reused}))
"""


@contextmanager
def ray_cluster(nodes: int) -> Iterator[str]:
    """A local Ray cluster of `nodes` nodes of one CPU each, run by a process of its own
    (`serve_ray_cluster`): the head's address. Ray installs its signal handlers in the
    process that starts it, so that is never the tests' own."""
    env = {**cli_env(), "PYTHONPATH": os.pathsep.join([str(TESTS), cli_env()["PYTHONPATH"]])}
    server = subprocess.Popen(
        [sys.executable, "-c", f"import data_helpers; data_helpers.serve_ray_cluster({nodes})"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        yield _address_of(server)
    finally:
        try:
            server.communicate(timeout=RAY_STOP_TIMEOUT)  # closing its input stops it
        except subprocess.TimeoutExpired:
            server.kill()
            server.communicate()


def _address_of(server: subprocess.Popen[str]) -> str:
    """The address the cluster's process prints once every node is up."""
    deadline = time.monotonic() + RAY_START_TIMEOUT
    assert server.stdout is not None
    while time.monotonic() < deadline:
        if select.select([server.stdout], [], [], 1.0)[0]:
            line = server.stdout.readline()
            if line.startswith("{"):
                return str(json.loads(line)["address"])
            if not line:  # it exited
                break
    server.kill()
    pytest.fail(f"the Ray cluster did not start (exit {server.wait()})", pytrace=False)


def serve_ray_cluster(nodes: int) -> None:
    """Run a local Ray cluster until standard input closes: the head's address, printed."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        for _ in range(nodes - 1):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        print(json.dumps({"address": cluster.address}), flush=True)
        sys.stdin.read()
    finally:
        cluster.shutdown()
