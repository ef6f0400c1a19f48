"""`prepare`: text, JSON lines and Parquet into packed windows, once; one line for bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from {{ cookiecutter.package_name }}.data.encoding import (
    BYTE_EOD,
    IGNORE,
    document_keys,
    held_out,
)
from {{ cookiecutter.package_name }}.data.manifest import PLAN, read_manifest

from data_helpers import (
    corpus_jsonl,
    dataset_files,
    documents,
    manifest,
    prepare_apart,
    prompt_completion_jsonl,
    read_windows,
    run_apart,
    write_jsonl,
    write_parquet,
)
from gates import children, signal_taken
from gcs_emulator import ObjectGate
from training_helpers import cli_env

SEQ_LEN = 16


def prepare_bytes(inputs: list[Any], out: Path | str, echo: Any = print, **settings: Any) -> Any:
    """`prepare` into `out` with bytes for tokens, in a process of its own (`prepare_apart`)."""
    options = {"seq_len": SEQ_LEN, "eval_fraction": 0.1, **settings}
    return prepare_apart(inputs, out, echo, **options)


def test_documents_are_packed_in_order_with_an_end_id_between_them(tmp_path: Path) -> None:
    """It concatenates each split's documents, each ended by id 255, into windows of seq_len+1."""
    texts = documents(300)
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in texts])
    summary, _ = prepare_bytes([source], tmp_path / "out")

    evaluated = held_out(document_keys(texts), 0.1)
    for split, chosen in (("train", ~evaluated), ("eval", evaluated)):
        kept = [t for t, keep in zip(texts, chosen, strict=True) if keep]
        stream = b"".join(t.encode() + bytes([BYTE_EOD]) for t in kept)
        windows = read_windows(tmp_path / "out", split)["input_ids"]
        flat = bytes(i for window in windows for i in window)
        assert all(len(w) == SEQ_LEN + 1 for w in windows)
        assert flat == stream[: len(flat)] and len(stream) - len(flat) < SEQ_LEN + 1
    total = sum(len(t.encode()) + 1 for t in texts)
    assert summary.tokens == total  # type: ignore[attr-defined]
    assert summary.sequences_total * (SEQ_LEN + 1) + summary.dropped_tokens == total  # type: ignore[attr-defined]


def test_windows_record_where_each_document_starts(tmp_path: Path) -> None:
    """It writes each token's position in its document, from 0 at every document's first
    token and at every window's first, and training reads an input's from its target's."""
    from {{ cookiecutter.package_name }}.data.reading import PackedWindows

    texts = documents(200)
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in texts])
    summary, _ = prepare_bytes([source], tmp_path / "out")
    windows = read_windows(tmp_path / "out")
    ids, positions = np.array(windows["input_ids"]), np.array(windows["positions"])

    for window, places in zip(ids, positions, strict=True):
        expected, at = [], 0
        for index in range(SEQ_LEN + 1):
            at = 0 if index == 0 or window[index - 1] == BYTE_EOD else at + 1
            expected.append(at)
        assert places.tolist() == expected
    sample = PackedWindows(str(tmp_path / "out" / "train"), summary.sequences["train"])[0]
    # An input's document is its target's: an end id starts the document after it.
    starts = [0] + [i for i in range(1, SEQ_LEN) if ids[0][i] == BYTE_EOD]
    inputs = sample["positions"].tolist()
    assert [i for i, p in enumerate(inputs) if p == 0] == starts
    assert inputs == [i - max(s for s in starts if s <= i) for i in range(SEQ_LEN)]


def test_held_out_documents_are_an_even_share() -> None:
    """It holds out close to the asked share of documents, spread through the corpus."""
    chosen = held_out(np.arange(10_000), 0.05)
    assert 0.045 < chosen.mean() < 0.055
    assert all(0.03 < part.mean() < 0.07 for part in np.array_split(chosen, 10))


def test_text_jsonl_and_parquet_give_the_same_windows(tmp_path: Path) -> None:
    """It reads a text field of JSON lines, a Parquet column and lines of text alike."""
    texts = documents(200, words=(1, 8))
    write_jsonl(tmp_path / "in" / "c.jsonl", [{"body": t, "n": i} for i, t in enumerate(texts)])
    write_parquet(tmp_path / "in" / "c.parquet", {"body": texts, "n": list(range(len(texts)))})
    (tmp_path / "in" / "c.txt").write_text("\n".join(texts) + "\n")

    prepare_bytes([tmp_path / "in" / "c.jsonl"], tmp_path / "j", field="body")
    prepare_bytes([tmp_path / "in" / "c.parquet"], tmp_path / "p", field="body")
    prepare_bytes([tmp_path / "in" / "c.txt"], tmp_path / "t")  # a line is a document

    json_lines, parquet = read_windows(tmp_path / "j"), read_windows(tmp_path / "p")
    assert json_lines == parquet == read_windows(tmp_path / "t")


def test_globs_and_folders_name_every_file(tmp_path: Path) -> None:
    """It reads every file a glob or a folder names, in sorted order."""
    for part in range(3):
        corpus_jsonl(tmp_path / "in" / f"part{part}", count=50, seed=part)
    by_glob, _ = prepare_bytes([tmp_path / "in" / "part*" / "corpus.jsonl"], tmp_path / "g")
    by_folder, _ = prepare_bytes([tmp_path / "in"], tmp_path / "f")
    assert by_glob.documents == by_folder.documents == 150  # type: ignore[attr-defined]
    assert len(by_glob.inputs) == 3  # type: ignore[attr-defined]
    assert read_windows(tmp_path / "g") == read_windows(tmp_path / "f")


def test_a_dataset_prepared_among_its_inputs_is_not_read_as_one(tmp_path: Path) -> None:
    """It skips the files of a prepared dataset inside the input folder: a rerun reuses it."""
    corpus_jsonl(tmp_path / "in")
    first, _ = prepare_bytes([tmp_path / "in"], tmp_path / "in" / "prepared")
    again, reused = prepare_bytes([tmp_path / "in"], tmp_path / "in" / "prepared")
    assert reused and again.inputs == first.inputs == [str(tmp_path / "in" / "corpus.jsonl")]  # type: ignore[attr-defined]


def test_preparing_again_reuses_the_result(tmp_path: Path) -> None:
    """It reuses a dataset prepared from the same inputs and settings, and refuses to mix."""
    source = corpus_jsonl(tmp_path)
    first, reused_first = prepare_bytes([source], tmp_path / "out")
    written = (tmp_path / "out" / "prepared.json").stat().st_mtime_ns
    again, reused_again = prepare_bytes([source], tmp_path / "out")

    assert (reused_first, reused_again) == (False, True)
    assert again == first
    assert (tmp_path / "out" / "prepared.json").stat().st_mtime_ns == written
    with pytest.raises(ValueError, match="already holds other data"):
        prepare_bytes([source], tmp_path / "out", seq_len=8)


def test_prompt_tokens_carry_no_loss(tmp_path: Path) -> None:
    """It masks every target that belongs to a prompt (-100) and keeps completions and ends."""
    source = prompt_completion_jsonl(tmp_path)
    summary, _ = prepare_bytes([source], tmp_path / "out")
    windows = read_windows(tmp_path / "out")

    ids = np.array(windows["input_ids"])[:, 1:]  # the targets of each window
    labels = np.array(windows["labels"])[:, 1:]
    prompt = ((ids >= ord("A")) & (ids <= ord("Z"))) | (ids == ord("_"))  # as the prompts are
    assert (labels[prompt] == IGNORE).all()
    assert (labels[~prompt] == ids[~prompt]).all()
    share = summary.loss_tokens / (summary.sequences_total * SEQ_LEN)  # type: ignore[attr-defined]
    assert 0.0 < share < 1.0 and manifest(tmp_path / "out")["masked"]


def invoke_prepare(*args: str) -> tuple[int, list[str]]:
    """The CLI's `prepare` in a process of its own: its exit code and its error lines."""
    result = run_apart(["-m", "{{ cookiecutter.package_name }}", "prepare", *args])
    return result.returncode, result.stderr.strip().splitlines()


def _undecodable(folder: Path) -> Path:
    path = folder / "bad.jsonl"
    path.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    return path


BAD_INPUT = {
    "missing-path": (lambda tmp: tmp / "no-such.jsonl", [], "does not exist"),
    "missing-field": (
        corpus_jsonl,
        ["--field", "body"],
        "has no field 'body' (its fields: id, text)",
    ),
    "column-not-text": (
        lambda tmp: write_parquet(tmp / "c.parquet", {"text": [1, 2, 3]}),
        [],
        "field 'text' of",
    ),
    "empty-corpus": (lambda tmp: write_jsonl(tmp / "e.jsonl", []), [], "empty"),
    "empty-texts": (lambda tmp: write_jsonl(tmp / "e.jsonl", [{"text": ""}] * 5), [], "no text"),
    "undecodable": (_undecodable, [], "bad.jsonl:2 (byte 30)"),
    "unknown-format": (
        lambda tmp: (tmp / "c.csv").write_text("a,b\n") and tmp / "c.csv",
        [],
        "not a corpus file",
    ),
    "too-short": (lambda tmp: corpus_jsonl(tmp, count=2), [], "fills no sequence"),
}


@pytest.mark.parametrize("make,args,message", BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_fails_with_one_line_and_writes_nothing(  # type: ignore[no-untyped-def]
    tmp_path: Path, make, args: list[str], message: str
) -> None:
    """It refuses bad input with one line, exit code 2, and leaves no prepared dataset."""
    source = make(tmp_path)
    out = tmp_path / "prepared"
    code, lines = invoke_prepare(str(source), "--out", str(out), *args)
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert not out.exists()
    assert not list(tmp_path.glob(".partial-*"))


def test_hub_data_without_datasets_says_what_to_install(tmp_path: Path) -> None:
    """It names the package to install for hf: data when `datasets` is missing."""
    blocked = "import sys; sys.modules['datasets'] = None; "
    run = "from {{ cookiecutter.package_name }}.cli import main; main()"
    out = str(tmp_path / "o")
    result = subprocess.run(
        [sys.executable, "-c", blocked + run, "prepare", "hf:wikitext", "--out", out],
        env=cli_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: hf:wikitext needs the `datasets` package, which is not installed: pip install "
        "'datasets>=5.2,<6' (or reinstall the project: pip install -e .)"
    ]


def start_prepare(source: Path | str, out: Path | str, *args: str,
                  workers: int = 1) -> subprocess.Popen[str]:  # fmt: skip
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "prepare", str(source)]
    return subprocess.Popen(
        [*command, "--out", str(out), "--num-proc", str(workers), "--eval-fraction", "0.1",
         "--set", f"task_options.seq_len={SEQ_LEN}", *args],
        env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


@pytest.mark.interrupts
def test_interrupted_prepare_keeps_its_shards_and_the_rerun_finishes(
    gated_gcs_bucket: tuple[str, ObjectGate], tmp_path: Path
) -> None:
    """It stops on SIGTERM with no manifest, keeps the finished shards, and a rerun writes
    the rest: the same dataset as an uninterrupted run."""
    import fsspec

    bucket, gate = gated_gcs_bucket
    for part in range(5):
        path = corpus_jsonl(tmp_path / "in" / str(part), count=4_000, seed=part)
        fsspec.filesystem("gs").put(str(path), f"{bucket[5:]}/raw/part{part}.jsonl")
    source, out = f"{bucket}/raw/*.jsonl", tmp_path / "out"
    # One worker takes the shards in order: while the read of the last file is held, the
    # shards before it are written and the rest cannot be. The signal comes then.
    gate.hold("raw/part4.jsonl")
    process = start_prepare(source, out, "--shard-size", "64K")
    try:
        gate.held(process)
        signal_taken(process, signal.SIGTERM)
        output = process.communicate(timeout=120)[0]
    finally:
        process.kill()
        gate.release(drop=True)
    assert process.returncode == 130, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("error: interrupted: ") and "the same command finishes" in last
    assert not (out / "prepared.json").exists() and not list(out.glob(".tmp-*"))

    kept = {p: p.stat().st_mtime_ns for p in (out / "train").glob("*.arrow")}
    lines: list[str] = []
    prepare_bytes([source], out, shard_size=64 << 10, num_proc=1, echo=lines.append)
    prepare_bytes([source], tmp_path / "whole", shard_size=64 << 10, num_proc=1)
    assert f"resuming: {len(kept)} already written" in lines[0] and len(kept) >= 3
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # not written again
    assert read_windows(out) == read_windows(tmp_path / "whole")


def test_shards_read_every_document_once_whatever_their_size(tmp_path: Path) -> None:
    """It cuts files into shards at line starts: each document is read once, in any plan."""
    for part in range(3):
        corpus_jsonl(tmp_path / "in" / f"part{part}", count=300, seed=part)
    (tmp_path / "in" / "lines.txt").write_text("".join(t + "\n" for t in documents(200)))
    one, _ = prepare_bytes([tmp_path / "in" / "part0", tmp_path / "in" / "part1"], tmp_path / "a")
    many, _ = prepare_bytes(
        [tmp_path / "in" / "part0", tmp_path / "in" / "part1"], tmp_path / "b", shard_size=3000
    )
    assert one.shards == 1 and many.shards > 10  # type: ignore[attr-defined]
    assert (many.documents, many.tokens) == (one.documents, one.tokens) == (600, one.tokens)  # type: ignore[attr-defined]
    text, _ = prepare_bytes([tmp_path / "in" / "lines.txt"], tmp_path / "t", shard_size=1000)
    assert text.documents == 200  # type: ignore[attr-defined]


@pytest.mark.interrupts
def test_a_file_removed_while_preparing_and_a_taken_output_fail_in_one_line(
    gated_gcs_bucket: tuple[str, ObjectGate], tmp_path: Path
) -> None:
    """It refuses, in one line, a corpus file deleted after planning (removing what it wrote)
    and an output that holds another dataset (leaving that dataset whole)."""
    import fsspec

    first = corpus_jsonl(tmp_path / "in" / "a", count=8_000)
    last = corpus_jsonl(tmp_path / "in" / "b", count=300)
    bucket, gate = gated_gcs_bucket
    # The plan is written once every input is listed, before any is read: held there,
    # prepare has listed the file the test removes and reads it only after.
    gate.hold(f"out/{PLAN}")
    process = start_prepare(tmp_path / "in", f"{bucket}/out", "--shard-size", "64K")
    try:
        gate.held(process)
        last.unlink()
        gate.release()
        output = process.communicate(timeout=120)[0]
    finally:
        process.kill()
        gate.release()
    errors = [line for line in output.splitlines() if line.startswith("error")]
    assert process.returncode == 2, output
    assert errors == [f"error: {last} was removed after prepare listed it: run prepare again"]
    gcs = fsspec.filesystem("gs")
    gcs.invalidate_cache()
    assert not gcs.exists(f"{bucket}/out")

    out = tmp_path / "out"
    prepare_bytes([first], out)
    code, lines = invoke_prepare(str(first), "--out", str(out), "--set", "task_options.seq_len=8")
    assert code == 2 and len(lines) == 1 and "already holds other data" in lines[0], lines
    assert manifest(out)["seq_len"] == SEQ_LEN


@pytest.mark.interrupts
def test_gcs_inputs_to_gcs_put_nothing_on_local_disk(
    gated_gcs_bucket: tuple[str, ObjectGate], tmp_path: Path
) -> None:
    """It prepares gs:// files into gs:// streaming each shard's windows to their objects:
    while two workers are inside their shards, nothing is on local disk."""
    import fsspec

    bucket, gate = gated_gcs_bucket
    for part in range(16):
        path = corpus_jsonl(tmp_path / "in" / f"{part:02d}", count=400, seed=part)
        fsspec.filesystem("gs").put(str(path), f"{bucket[5:]}/raw/part{part:02d}.jsonl")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "prepare",
               f"{bucket}/raw/*.jsonl", "--out", f"{bucket}/prepared", "--num-proc", "2",
               "--shard-size", "8K", "--set", f"task_options.seq_len={SEQ_LEN}"]  # fmt: skip
    # Held in the read of a file in the middle, one worker is inside a shard; the other is
    # inside one too, waiting on the same server (it serves one request at a time).
    gate.hold("raw/part08.jsonl")
    process = subprocess.Popen(
        command, env={**cli_env(), "TMPDIR": str(scratch)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        gate.held(process)
        # torch.distributed.nn writes a module template of its own into a temp folder when
        # imported (`_remote_module_non_scriptable.py`): not the data's.
        staged = sorted(
            str(p.relative_to(scratch))
            for p in scratch.rglob("*")
            if p.is_file() and not p.name.startswith("_remote_module_")
        )
        gate.release()
        output = process.communicate(timeout=300)[0]
    finally:
        process.kill()
        gate.release()
    assert process.returncode == 0, output
    assert staged == []
    made = read_manifest(f"{bucket}/prepared")
    assert made is not None and made.documents == 16 * 400 and made.shards > 16


@pytest.mark.parametrize("written", [100 << 10, 600 << 10], ids=["unsent", "partly-sent"])
def test_a_failed_shard_leaves_none_of_its_files_in_gcs(gcs_bucket: str, written: int) -> None:
    """It abandons a failed shard's uploads, whether they had begun sending parts or not, so
    that no part of its window files ever appears, even once the files are closed (as
    fsspec closes a write file it collects, and closing finalizes an upload)."""
    import fsspec

    from {{ cookiecutter.package_name }}.data.shards import ShardFiles

    files = ShardFiles(f"{gcs_bucket}/prepared", 7, 256 << 10)
    uploads = list(files.sinks.values())
    for upload in uploads:
        upload.write(os.urandom(written))
    files.discard()
    for upload in uploads:
        upload.close()
    gcs = fsspec.filesystem("gs")
    gcs.invalidate_cache()
    assert gcs.find(gcs_bucket) == []


@pytest.mark.interrupts
def test_a_killed_worker_fails_in_one_line_naming_its_shard_and_the_rerun_finishes(
    gated_gcs_bucket: tuple[str, ObjectGate], tmp_path: Path
) -> None:
    """It reports a worker killed inside a shard in one line naming that shard (exit code
    1), keeps the shards written, and a rerun gives an uninterrupted run's bytes."""
    import fsspec

    bucket, gate = gated_gcs_bucket
    sizes = {"a": 3_000, "b": 10, "c": 3_000}  # b: read by one shard only
    for name, count in sizes.items():
        path = corpus_jsonl(tmp_path / "in" / name, count=count, seed=len(name) + count)
        fsspec.filesystem("gs").put(str(path), f"{bucket[5:]}/raw/{name}.jsonl")
    source, out = f"{bucket}/raw/*.jsonl", tmp_path / "out"
    gate.hold("raw/b.jsonl")
    process = start_prepare(source, out, "--shard-size", "64K", workers=2)
    try:
        gate.held(process)
        shards = json.loads((out / PLAN).read_text())["shards"]
        [held] = [s["index"] for s in shards if any("/b.jsonl" in p["url"] for p in s["pieces"])]
        worker = gate.client(children(process.pid))
        os.kill(worker, signal.SIGKILL)
        gate.abandoned()
        output = process.communicate(timeout=120)[0]
    finally:
        process.kill()
        gate.release(drop=True)
    errors = [line for line in output.splitlines() if line.startswith("error")]
    assert process.returncode == 1, output
    assert len(errors) == 1 and errors[0].startswith(f"error: shard {held} ({bucket}/raw/"), errors
    assert "failed: its worker process died (killed by SIGKILL); " in errors[0]
    assert errors[0].endswith("the same command finishes the rest")
    assert not (out / "prepared.json").exists()

    written = [p.name.removesuffix(".done") for p in out.glob("shards/*.done")]
    kept = {p: p.stat().st_mtime_ns for name in written for p in out.glob(f"*/{name}.*")}
    lines: list[str] = []
    prepare_bytes([source], out, shard_size=64 << 10, num_proc=1, echo=lines.append)
    prepare_bytes([source], tmp_path / "whole", shard_size=64 << 10, num_proc=1)
    assert f"resuming: {len(written)} already written" in lines[0], lines
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # not written again
    assert dataset_files(out) == dataset_files(tmp_path / "whole")


def test_a_script_that_prepares_with_workers_runs_once(tmp_path: Path) -> None:
    """It prepares with several workers from a script that calls `prepare` at its top level
    (no `if __name__ == "__main__"` guard): the workers do not run the script again."""
    source, out = corpus_jsonl(tmp_path / "in", count=2_000), tmp_path / "out"
    script = tmp_path / "prepare_corpus.py"
    script.write_text(
        "from {{ cookiecutter.package_name }}.data.encoding import Tokenizer\n"
        "from {{ cookiecutter.package_name }}.data.prepare import Settings, prepare\n"
        "print('the script runs')\n"
        f"settings = Settings({SEQ_LEN}, num_proc=2, shard_size=16 << 10)\n"
        f"made, _ = prepare([{str(source)!r}], {str(out)!r}, Tokenizer(), 256, settings)\n"
    )
    result = run_apart([str(script)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines().count("the script runs") == 1, result.stdout
    assert manifest(out)["documents"] == 2_000 and manifest(out)["shards"] > 2


def test_make_prepare_writes_a_prepared_dataset(tmp_path: Path) -> None:
    """It prepares INPUTS into OUT through `make prepare`, and says how to train on it."""
    project = Path(__file__).resolve().parents[1]
    source = corpus_jsonl(tmp_path)
    out = tmp_path / "out"
    result = subprocess.run(
        ["make", "-C", str(project), f"VENV={sys.prefix}", "prepare", f"INPUTS={source}",
         f"OUT={out}", "ARGS=--set task_options.seq_len=16"],
        env=cli_env(), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"train with: --data {out}" in result.stdout
    assert manifest(out)["documents"] == 400
{%- if cookiecutter.example_task == "hf-causal-lm" %}


# A chat template in Jinja, spelled so that no template marker is left in this file once the
# project is generated from it.
BLOCK, END, VALUE, DONE = "{" + "%", "%" + "}", "{" + "{", "}" + "}"
CHAT_TEMPLATE = (
    f"{BLOCK} for m in messages {END}<|{VALUE} m['role'] {DONE}|>{VALUE} m['content'] {DONE}"
    f"<|end|>{BLOCK} endfor {END}{BLOCK} if add_generation_prompt {END}<|assistant|>"
    f"{BLOCK} endif {END}"
)


def tiny_model(folder: Path, vocab_shortfall: int = 0) -> Path:
    """A tiny Llama and a BPE tokenizer trained here, with an end token and a chat template."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = RustTokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    special = ["<unk>", "<eos>", "<|user|>", "<|assistant|>", "<|end|>"]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=special, show_progress=False)
    bpe.train_from_iterator(documents(500), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>", unk_token="<unk>")
    tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=len(tokenizer) - vocab_shortfall, hidden_size=32, intermediate_size=64,
        num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_prepare_tokenizes_with_the_models_own_tokenizer(tmp_path: Path) -> None:
    """It tokenizes with the model's tokenizer and ends each document with its eos id."""
    from transformers import AutoTokenizer

    model = tiny_model(tmp_path / "model")
    source = corpus_jsonl(tmp_path, count=300)
    code, lines = invoke_prepare(
        str(source), "--out", str(tmp_path / "out"), "--set", f"task_options.model_name={model}",
        "--set", "task_options.seq_len=16",
    )  # fmt: skip
    assert code == 0, lines
    tokenizer = AutoTokenizer.from_pretrained(model)
    windows = read_windows(tmp_path / "out")["input_ids"]
    text = tokenizer.decode([i for w in windows for i in w])
    assert "<eos>" in text and "alpha" in text
    assert manifest(tmp_path / "out")["eod_id"] == tokenizer.eos_token_id


def test_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path: Path) -> None:
    """It refuses a tokenizer whose ids the model's embeddings cannot hold, in one line."""
    model = tiny_model(tmp_path / "model", vocab_shortfall=10)
    out = tmp_path / "out"
    code, lines = invoke_prepare(
        str(corpus_jsonl(tmp_path)), "--out", str(out), "--set", f"task_options.model_name={model}"
    )
    assert code == 2 and len(lines) == 1
    assert "more than the model's vocabulary" in lines[0] and not out.exists()


def test_dataset_of_another_tokenizer_is_refused(tmp_path: Path) -> None:
    """It refuses to train on ids made by another tokenizer (here bytes), in one line."""
    from training_helpers import cli, write_config

    model = tiny_model(tmp_path / "model")
    out = tmp_path / "out"
    prepared = invoke_prepare(
        str(corpus_jsonl(tmp_path)), "--out", str(out), "--set", "task_options.seq_len=16"
    )
    assert prepared[0] == 0, prepared
    options = {"model_name": str(model), "seq_len": 16}
    config = write_config(tmp_path, max_steps=1, task_options=options)
    run_dir = str(tmp_path / "r")
    result = cli("train", "--config", str(config), "--data", str(out), "--run-dir", run_dir)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1
    assert "was prepared with tokenizer bytes" in lines[0]


def test_chat_loss_falls_on_assistant_turns_only(tmp_path: Path) -> None:
    """It renders messages with the chat template and masks all but the assistant's turns."""
    from transformers import AutoTokenizer

    model = tiny_model(tmp_path / "model")
    turns = [("user", "alpha beta"), ("assistant", "gamma"), ("user", "delta"),
             ("assistant", "eta theta")]  # fmt: skip
    # Each conversation its own (a user turn numbered): copies would share one split.
    chats = [
        {"messages": [{"role": r, "content": c + (f" {n}" if r == "user" else "")}
                      for r, c in turns]}
        for n in range(100)
    ]  # fmt: skip
    source = write_jsonl(tmp_path / "chat.jsonl", chats)
    code, lines = invoke_prepare(
        str(source), "--out", str(tmp_path / "out"), "--set", f"task_options.model_name={model}",
        "--set", "task_options.seq_len=32", "--eval-fraction", "0.2",
    )  # fmt: skip
    assert code == 0, lines
    tokenizer = AutoTokenizer.from_pretrained(model)
    windows = read_windows(tmp_path / "out")
    carried = [i for row in windows["labels"] for i in row if i != IGNORE]
    masked = [i for ids, labels in zip(windows["input_ids"], windows["labels"], strict=True)
              for i, label in zip(ids, labels, strict=True) if label == IGNORE]  # fmt: skip
    said = set(tokenizer.decode(carried).replace("<|end|>", " ").replace("<eos>", " ").split())
    assert said == {"gamma", "eta", "theta"}  # and the end of each turn and conversation
    heard = set(tokenizer.decode(masked).replace("|>", " ").replace("<|", " ").split())
    assert {"alpha", "beta", "delta"} <= heard and not heard & {"gamma", "eta", "theta"}
{%- endif %}
