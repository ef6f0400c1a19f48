"""Training on a prepared dataset: read by index, refused when made for another run, resumed
at its position with nothing read twice, and the same from gs://."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset

from {{ cookiecutter.package_name }}.core import make_plan
from {{ cookiecutter.package_name }}.data.encoding import IGNORE, Tokenizer
from {{ cookiecutter.package_name }}.data.prepare import Settings, prepare
from {{ cookiecutter.package_name }}.tasks import WEIGHT, load_task
from {{ cookiecutter.package_name }}.tasks._corpus import token_loss, token_metrics
from {{ cookiecutter.package_name }}.training import TrainConfig, fit

from data_helpers import corpus_jsonl, prompt_completion_jsonl, read_windows
from training_helpers import TINY, cli, write_config

SEQ_LEN = TINY["task_options"]["seq_len"]


def prepared(folder: Path, source: Path, eval_fraction: float = 0.1) -> Path:
    out = folder / "prepared"
    task = load_task(TINY["task"], options=TINY["task_options"])
    tokenizer = Tokenizer(getattr(task, "tokenizer", None))
    settings = Settings(SEQ_LEN, eval_fraction=eval_fraction)
    prepare([str(source)], str(out), tokenizer, int(task.vocab_size), settings)
    return out


def test_task_reads_the_prepared_windows_by_index(tmp_path: Path) -> None:
    """It gives each prepared window as inputs and next-token targets, masks included."""
    out = prepared(tmp_path, prompt_completion_jsonl(tmp_path))
    task = load_task(TINY["task"], str(out), TINY["task_options"])
    windows = read_windows(out)
    train = task.train_dataset()

    assert len(train) == len(windows["input_ids"])  # type: ignore[arg-type]
    for index in (0, len(train) // 2, len(train) - 1):  # type: ignore[arg-type]
        sample = train[index]
        assert sample["x"].tolist() == windows["input_ids"][index][:-1]
        assert sample["y"].tolist() == windows["labels"][index][1:]
    assert (torch.stack([train[i]["y"] for i in range(50)]) == IGNORE).any()


def test_token_loss_and_metrics_skip_masked_targets() -> None:
    """It averages the loss over the targets that carry it, and weighs samples by their count."""
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 7)
    targets = torch.randint(0, 7, (3, 5))
    targets[0, :2] = IGNORE
    targets[2] = IGNORE  # a window of prompt alone
    per_token = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    carried = targets != IGNORE

    assert torch.allclose(token_loss(logits, targets), per_token[carried].mean())
    metrics = token_metrics(logits, targets)
    assert metrics[WEIGHT].tolist() == [3.0, 5.0, 0.0]
    assert torch.allclose(
        metrics["loss"][:2], torch.stack([per_token[i][carried[i]].mean() for i in range(2)])
    )
    assert metrics["loss"][2] == 0.0


def _without_manifest(folder: Path) -> Path:
    (folder / "prepared.json").unlink()  # as a prepare stopped before its end would leave it
    return folder


REFUSED = {
    "raw-json-lines": (lambda tmp: corpus_jsonl(tmp), [], "Prepare it first: prepare"),
    "other-seq-len": (
        lambda tmp: prepared(tmp, corpus_jsonl(tmp)),
        ["--set", f"task_options.seq_len={SEQ_LEN * 2}"],
        f"was prepared for seq_len {SEQ_LEN}, this run has {SEQ_LEN * 2}",
    ),
    "half-prepared": (
        lambda tmp: _without_manifest(prepared(tmp, corpus_jsonl(tmp))),
        [],
        "is not a whole prepared dataset",
    ),
}


@pytest.mark.parametrize("make,args,message", REFUSED.values(), ids=REFUSED.keys())
def test_data_not_made_for_the_run_is_refused_in_one_line(  # type: ignore[no-untyped-def]
    tmp_path: Path, make, args: list[str], message: str
) -> None:
    """It refuses raw records and a dataset prepared for another run, one line, exit code 2."""
    data = make(tmp_path)
    config = write_config(tmp_path, max_steps=2)
    result = cli("train", "--config", str(config), "--data", str(data), "--run-dir",
                 str(tmp_path / "run"), *args)  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


class Counted(Dataset):  # type: ignore[type-arg]
    """A dataset that remembers every index read from it."""

    def __init__(self, data: Any) -> None:
        self.data = data
        self.read: list[int] = []

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Any:
        self.read.append(index)
        return self.data[index]


class CountingTask:
    """The project's task on a prepared dataset, its training reads counted."""

    def __init__(self, data: Path) -> None:
        self.task = load_task(TINY["task"], str(data), TINY["task_options"])
        self.counted = Counted(self.task.train_dataset())
        self.name = self.task.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self.task, name)

    def train_dataset(self) -> Counted:
        return self.counted


@pytest.mark.slow
def test_resume_reads_no_batch_twice_and_gives_the_same_losses(tmp_path: Path) -> None:
    """It resumes mid-epoch at the saved position: no trained batch read again, losses equal."""
    data = prepared(tmp_path, corpus_jsonl(tmp_path, count=25), eval_fraction=0.2)
    batch = TINY["batch_size"]
    per_epoch = len(CountingTask(data).counted) // batch
    resume_at, total = per_epoch // 2, per_epoch + 3  # mid-epoch, then into the next epoch
    settings = {
        **TINY, "accelerator": "cpu", "data": str(data), "max_steps": total, "log_every": 1,
        "seed": 5, "checkpoint_every": resume_at, "keep_checkpoints": 9,
    }  # fmt: skip
    plan = make_plan("cpu", 1, "single")

    whole = CountingTask(data)
    first = fit(TrainConfig(**settings, run_dir=str(tmp_path / "a")), plan, task=whole)  # type: ignore[arg-type]
    resumed_task = CountingTask(data)
    checkpoint = str(tmp_path / "a" / "checkpoints" / str(resume_at))
    resumed = fit(
        TrainConfig(**settings, run_dir=str(tmp_path / "b"), resume=checkpoint),
        plan,
        task=resumed_task,  # type: ignore[arg-type]
    )

    assert resumed["train_losses"] == first["train_losses"]
    shape_probe = batch  # one batch read at start-up for the shapes, before any step
    after_probe = resumed_task.counted.read[shape_probe:]
    trained_later = whole.counted.read[shape_probe + resume_at * batch :]
    steps_left = (total - resume_at) * batch
    assert after_probe[:steps_left] == trained_later[:steps_left]


@pytest.mark.slow
def test_prepared_dataset_on_gcs_trains_in_place_with_the_losses_of_a_local_copy(
    gcs_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It trains from a gs:// prepared dataset read in place (nothing copied to local disk)
    with the losses of the same dataset read from a local folder."""
    import fsspec

    remote = f"{gcs_bucket}/prepared/corpus"
    task = load_task(TINY["task"], options=TINY["task_options"])
    tokenizer = Tokenizer(getattr(task, "tokenizer", None))
    settings = Settings(SEQ_LEN, eval_fraction=0.2, shard_size=8 << 10)
    made, _ = prepare([str(corpus_jsonl(tmp_path, count=300))], remote, tokenizer,
                      int(task.vocab_size), settings)  # fmt: skip
    assert made.shards > 2
    local = tmp_path / "local"
    fsspec.filesystem("gs").get(remote[5:], str(local), recursive=True)
    for name in ("HOME", "TMPDIR"):  # where a copy would land: watched, empty
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
        (tmp_path / name.lower()).mkdir()

    settings_of = {**TINY, "accelerator": "cpu", "max_steps": 6, "log_every": 1, "seed": 3,
                   "eval_every": 3}  # fmt: skip
    plan = make_plan("cpu", 1, "single")
    runs = {
        where: fit(TrainConfig(**settings_of, data=data, run_dir=str(tmp_path / where)), plan)
        for where, data in (("gcs", remote), ("local", str(local)))
    }
    assert runs["gcs"]["train_losses"] == runs["local"]["train_losses"]
    assert len(runs["gcs"]["train_losses"]) == 6
    assert runs["gcs"]["eval"] == runs["local"]["eval"]
    copied = [p for name in ("home", "tmpdir") for p in (tmp_path / name).rglob("*") if p.is_file()]
    assert not copied, copied
