"""`prepare` throughput: tokens/s per core against the tokenizer's own batch throughput.

    python benchmarks/data_bench.py [--megabytes 50] [--vocab 16000] [--workers 2] [--ray]
                                    [--gcs] [--out runs/data-bench]

Writes a corpus of JSON lines (the Python standard library's sources, a document per
top-level block, repeated to size), trains a byte-level BPE of `--vocab` ids on its first
megabytes (needs `transformers`: the `hf` extra), then measures on the same text: the
tokenizer alone, one process, batches of 1,000 documents; `prepare --engine local` with
`--workers` processes; and with `--ray`, `prepare --engine ray` on a local Ray cluster of
as many CPUs. Per core: tokens per CPU-second (user + system, the driver's and its worker
processes'), which a busy machine does not bend as it bends tokens/s of the wall clock;
for Ray (whose workers are not this process's children) the wall clock over the workers.
With `--gcs`, also `prepare` from gs:// to gs:// (the tests' local GCS server,
tests/gcs_emulator.py) with the default shard plan: the peak of local scratch (TMPDIR,
sampled every 10 ms) and a digest of the window files, indexes and shard records written, to
compare two versions' bytes.
Not a test: timings move with whatever else the machine runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core for the tokenizer alone, as per worker
SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))


def write_corpus(path: Path, megabytes: int) -> list[str]:
    """JSON lines of documents up to `megabytes`; the documents of one pass are returned."""
    documents = []
    for source in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = source.read_text(errors="replace")
        documents += [block for block in text.split("\n\n\n") if block.strip()]
    size, limit = 0, megabytes << 20
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        while size < limit:
            for doc in documents:
                line = json.dumps({"text": doc}) + "\n"
                out.write(line)
                size += len(line)
                if size >= limit:
                    break
    return documents


def train_tokenizer(documents: list[str], vocab: int, folder: Path) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<eos>"],
                                  show_progress=False)  # fmt: skip
    bpe.train_from_iterator(documents[:20_000], trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>", unk_token="<unk>")
    tokenizer.save_pretrained(folder)
    return PreTrainedTokenizerFast.from_pretrained(folder)  # as a task loads it


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children."""
    import resource

    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                          resource.RUSAGE_CHILDREN))  # fmt: skip
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def tokenizer_alone(tokenizer: Any, corpus: Path) -> tuple[float, float]:
    """Tokens/s and tokens per CPU-second of the tokenizer itself on the corpus's text,
    batches of 1,000, one core."""
    texts = [json.loads(line)["text"] for line in corpus.open()]
    started, cpu, tokens = time.perf_counter(), cpu_seconds(), 0
    for at in range(0, len(texts), 1000):
        ids = tokenizer(texts[at : at + 1000], add_special_tokens=False)["input_ids"]
        tokens += sum(len(row) + 1 for row in ids)  # + the end-of-document id prepare adds
    return tokens / (time.perf_counter() - started), tokens / (cpu_seconds() - cpu)


def prepared(corpus: Path | str, out: Path | str, tokenizer: Any, workers: int,
             **engine: Any) -> Any:  # fmt: skip
    from {{ cookiecutter.package_name }}.data.encoding import Tokenizer
    from {{ cookiecutter.package_name }}.data.prepare import Settings, prepare

    settings = Settings(2048, num_proc=workers, **engine)
    manifest, _ = prepare([str(corpus)], str(out), Tokenizer(tokenizer), len(tokenizer),
                          settings, echo=lambda line: None)  # fmt: skip
    return manifest


def folder_bytes(folder: Path) -> int:
    total = 0
    for parent, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.path.getsize(os.path.join(parent, name))
            except OSError:  # gone meanwhile
                continue
    return total


def gcs_to_gcs(corpus: Path, out: Path, tokenizer: Any, workers: int) -> dict[str, Any]:
    """`prepare` from gs:// to gs:// on a local GCS server, default shard plan: the peak of
    local scratch and a digest of the objects written."""
    sys.path.insert(0, str(SRC.parent / "tests"))
    from gcs_emulator import GcsEmulator, _start, _stop  # sets what gcsfs needs first

    out.mkdir(parents=True, exist_ok=True)
    process, endpoint = _start(out / "emulator.log")
    os.environ.update({"STORAGE_EMULATOR_HOST": endpoint, "FSSPEC_GS_TOKEN": "anon"})
    scratch = out / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(scratch)
    tempfile.tempdir = None  # read TMPDIR again, here and in the workers
    try:
        import fsspec

        fsspec.config.conf["gs"] = {"token": "anon"}  # fsspec read FSSPEC_* when imported
        bucket = GcsEmulator(endpoint).create_bucket("data-bench")
        gcs = fsspec.filesystem("gs", token="anon")
        gcs.put(str(corpus), f"{bucket[5:]}/raw/corpus.jsonl")
        peak, done = [0], threading.Event()

        def sample() -> None:
            while not done.wait(0.01):
                peak[0] = max(peak[0], folder_bytes(scratch))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            made = prepared(f"{bucket}/raw/corpus.jsonl", f"{bucket}/prepared", tokenizer, workers)
        finally:
            done.set()
            sampler.join()
        digest = hashlib.sha256()  # what does not name the inputs' dates (the fingerprint)
        for name in sorted(gcs.find(f"{bucket[5:]}/prepared")):
            if name.endswith((".arrow", "/index.json", ".done")):
                digest.update(name.encode() + b"\0" + gcs.cat_file(name))
        return {"peak": peak[0], "digest": digest.hexdigest()[:16], "manifest": made}
    finally:
        _stop(process)


def parser() -> argparse.ArgumentParser:
    """The command line this script takes (the docs' commands are checked against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=50)
    parser.add_argument("--vocab", type=int, default=16_000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--ray", action="store_true", help="Also on a local Ray cluster.")
    parser.add_argument("--gcs", action="store_true", help="Also gs:// to gs:// (local server).")
    parser.add_argument("--out", type=Path, default=Path("runs/data-bench"))
    return parser


def main() -> None:
    args = parser().parse_args()
    import shutil

    shutil.rmtree(args.out / "prepared", ignore_errors=True)
    corpus = args.out / "corpus.jsonl"
    documents = write_corpus(corpus, args.megabytes)
    tokenizer = train_tokenizer(documents, args.vocab, args.out / "tokenizer")
    rows = {"tokenizer alone (1 core)": tokenizer_alone(tokenizer, corpus)}
    cpu = cpu_seconds()
    local = prepared(corpus, args.out / "prepared" / "local", tokenizer, args.workers)
    rows[f"prepare --engine local ({args.workers} workers)"] = (
        local.tokens / local.seconds,
        local.tokens / (cpu_seconds() - cpu),
    )
    if args.ray:
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": args.workers})
        try:
            made = prepared(corpus, args.out / "prepared" / "ray", tokenizer, args.workers,
                            engine="ray", ray_address=cluster.address)  # fmt: skip
        finally:
            cluster.shutdown()
        rate = made.tokens / made.seconds
        rows[f"prepare --engine ray ({args.workers} workers)"] = (rate, rate / args.workers)
    alone = rows["tokenizer alone (1 core)"][1]
    lines = [
        f"{args.megabytes} MB of JSON lines, {local.tokens:,} tokens, BPE of {len(tokenizer):,} "
        f"ids, {local.shards} shards",
        "| what | tokens/s | per core | vs the tokenizer alone |",
        "| --- | --- | --- | --- |",
    ]
    for name, (rate, per_core) in rows.items():
        lines.append(f"| {name} | {rate:,.0f} | {per_core:,.0f} | {per_core / alone:.2f}x |")
    if args.gcs:
        remote = gcs_to_gcs(corpus, args.out / "gcs", tokenizer, args.workers)
        lines.append(
            f"gs:// to gs:// ({args.workers} workers, {remote['manifest'].shards} shards): peak "
            f"local scratch {remote['peak'] / 2**20:.1f} MiB; objects' digest {remote['digest']}"
        )
    print("\n".join(lines))
    (args.out / "data-bench.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
