"""The command line: help, config resolution, and one clear line for every bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from {{ cookiecutter.package_name }}.cli import app

from backend_facts import STRATEGIES
from training_helpers import TINY, cli, write_config

runner = CliRunner()


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["train"],
        ["eval"],
        ["export"],
        ["profile"],
        ["debug"],
        ["doctor"],
        ["pod"],
        ["config", "show"],
{%- if cookiecutter.example_task != "vision" %}
        ["prepare"],
{%- endif %}
    ],
)
def test_every_command_has_help(command: list[str]) -> None:
    """It prints usage for every command."""
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0
    assert "Usage" in result.output


def test_train_help_names_the_backends_strategies_only() -> None:
    """It lists the strategies this backend runs in `train --help`, and no other."""
    result = runner.invoke(app, ["train", "--help"])
    assert result.exit_code == 0
    named = {name for name in ("single", "ddp", "spmd", "fsdp") if name in result.output}
    assert named == set(STRATEGIES), result.output


def test_config_show_applies_file_then_overrides(tmp_path: Path) -> None:
    """It resolves defaults < file < --set."""
    path = write_config(tmp_path, lr=0.5, seed=3)
    result = runner.invoke(app, ["config", "show", "--config", str(path), "--set", "seed=7"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert (shown["lr"], shown["seed"], shown["accelerator"]) == (0.5, 7, "cpu")


def test_set_reaches_nested_task_options(tmp_path: Path) -> None:
    """It sets a key inside a table (`task_options.seq_len=32`) over the file's, as TOML."""
    path = write_config(tmp_path)
    sets = ["--set", "task_options.seq_len=32", "--set", "task_options.extra=[1, 2]"]
    result = runner.invoke(app, ["config", "show", "--config", str(path), *sets])
    assert result.exit_code == 0, result.output
    options = json.loads(result.output)["task_options"]
    assert options["seq_len"] == 32 and options["extra"] == [1, 2]
    kept = {k: v for k, v in TINY["task_options"].items() if k != "seq_len"}
    assert kept.items() <= options.items()  # the file's other options stay


def _foreign_checkpoint(tmp_path: Path) -> Path:
    """A torch.distributed.checkpoint folder that some other program wrote."""
    import torch.distributed.checkpoint as dcp

    path = tmp_path / "foreign"
    dcp.save({"weights": torch.zeros(3), "format": "other"}, checkpoint_id=str(path))
    return path


def _garbage_checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "garbage"
    path.mkdir()
    (path / ".metadata").write_bytes(b"not a checkpoint")
    return path


def _empty_directory(tmp_path: Path) -> Path:
    path = tmp_path / "empty"
    path.mkdir()
    return path


BAD_TRAIN = {
    "unknown-precision": (["--precision", "fp8"], "unknown precision 'fp8'"),
    "unknown-strategy": (["--strategy", "zero"], "unknown strategy 'zero'"),
    "bad-mesh": (["--devices", "8", "--strategy", "fsdp", "--mesh", "fsdp=4"], "mesh 'fsdp=4'"),
    "unknown-mesh-axis": (["--devices", "8", "--strategy", "fsdp", "--mesh", "tp=8"], "'tp'"),
    "zero-devices": (["--devices", "0"], "invalid devices '0'"),
{%- if cookiecutter.backend == "torch_xla" %}
    "ddp-on-cpu": (["--devices", "8", "--strategy", "ddp"], "--strategy spmd"),
{%- endif %}
    "single-with-8": (["--devices", "8", "--strategy", "single"], "strategy 'single'"),
    "core-id-on-cpu": (["--devices", "[5]"], "needs a TPU"),
    "missing-data": (["--data", "/no/such/corpus"], "does not exist"),
    "negative-steps": (["--max-steps", "-5"], "max_steps must be positive"),
    "unknown-key": (["--set", "learning_rate=1"], "unknown config key 'learning_rate'"),
    "bad-override": (["--set", "lr"], "must look like key=value"),
    "bad-type": (["--set", "batch_size=big"], "batch_size must be int"),
    "unknown-optimizer": (["--set", "optimizer=lamb"], "unknown optimizer 'lamb'"),
    "missing-config": (["--config", "/no/such.toml"], "does not exist"),
    "unknown-logger": (["--set", "loggers=tensorboard,comet"], "unknown logger 'comet'"),
    "unknown-wandb-option": (["--set", "wandb.team=x"], "unknown wandb option 'team'"),
    "bad-wandb-tags": (["--set", "wandb.tags=spot"], "wandb.tags must be a list of text"),
}


@pytest.mark.parametrize("args,message", BAD_TRAIN.values(), ids=BAD_TRAIN.keys())
def test_bad_train_input_fails_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    """It rejects bad input with one line on stderr, exit code 2, and writes nothing."""
    run_dir = tmp_path / "run"
    result = runner.invoke(app, ["train", "--accelerator", "cpu", "--run-dir", str(run_dir), *args])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0]
    assert not run_dir.exists()


def test_config_file_with_unknown_key_fails(tmp_path: Path) -> None:
    """It names the unknown key of a config file."""
    path = tmp_path / "bad.toml"
    path.write_text('optimiser = "sgd"\n')
    result = runner.invoke(app, ["config", "show", "--config", str(path)])
    assert result.exit_code == 2
    assert "unknown config key 'optimiser'" in result.stderr


@pytest.mark.parametrize("command", ["eval", "export"])
@pytest.mark.parametrize(
    "make,message",
    [
        (_foreign_checkpoint, "is not a checkpoint of this project"),
        (_garbage_checkpoint, "cannot read checkpoint"),
        (_empty_directory, "neither a checkpoint nor a directory holding one"),
        (lambda tmp: tmp / "missing", "does not exist"),
    ],
    ids=["foreign", "unreadable", "empty-directory", "missing"],
)
def test_bad_checkpoint_fails_with_one_line(  # type: ignore[no-untyped-def]
    tmp_path: Path, command: str, make, message: str
) -> None:
    """It refuses foreign, corrupt, empty and missing checkpoints with one line, exit code 2."""
    extra = ["--out", str(tmp_path / "out.safetensors")] if command == "export" else []
    result = runner.invoke(app, [command, "--checkpoint", str(make(tmp_path)), *extra])
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.safetensors").exists()


def test_unwritable_run_dir_fails_with_one_line(tmp_path: Path) -> None:
    """It refuses a run directory below a file before anything starts."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = runner.invoke(
        app, ["train", "--accelerator", "cpu", "--run-dir", str(blocker / "run")]
    )
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"error: cannot write to run_dir {str(blocker / 'run')!r}: "
        f"{str(blocker)!r} is a file, not a directory"
    ]


def test_console_module_runs_as_python_m() -> None:
    """It runs as `python -m {{ cookiecutter.package_name }}` in a fresh process."""
    result = cli("--help")
    assert result.returncode == 0
    assert "train" in result.stdout and "eval" in result.stdout
