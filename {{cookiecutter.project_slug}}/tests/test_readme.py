"""The README and docs/ tell the truth: every command they show is checked, and they run."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from readme_inventory import (
    DOCS,
    README,
    covering_row,
    documented_commands,
    inventory,
    readme_commands,
    references,
)
from training_helpers import TINY, cli, write_config

TEXT = README.read_text()
PROJECT = README.parent


@pytest.mark.parametrize(("page", "command"), documented_commands())
def test_every_documented_command_is_in_the_inventory(page: str, command: str) -> None:
    """It lists every command of the README and docs/ in the inventory, with a named check."""
    rows = inventory(TEXT)
    prefix = covering_row(command, rows)
    assert prefix is not None, f"{page}: command not in the README's inventory: {command}"
    assert references(rows[prefix]), f"no check named for {prefix!r}"


def test_inventory_names_tests_that_exist() -> None:
    """It names only tests that exist in this project (template ones are checked there)."""
    missing = []
    for how in inventory(TEXT).values():
        for kind, path, name in references(how):
            if kind == "template":
                continue
            source = PROJECT / path
            if not source.is_file() or f"def {name}(" not in source.read_text():
                missing.append(f"{path}::{name}")
    assert not missing, missing


def test_readme_training_commands_run(tmp_path: Path) -> None:
    """It runs the training page's train, config show, eval and export commands (shortened)."""
    slug = "{{ cookiecutter.project_slug }} "
    commands: dict[str, str] = {}
    for command in readme_commands((DOCS / "training.md").read_text()):  # the first of each kind
        if command.startswith(slug):
            commands.setdefault(command.split()[1], command)
    config = write_config(tmp_path, max_steps=2, log_every=1)
    run_dir = tmp_path / "run"

    def args_of(name: str, tiny: bool = True) -> list[str]:
        words = shlex.split(commands[name])[1:]
        if tiny and "--config" in words:  # the shipped config, shortened to two steps
            words[words.index("--config") + 1] = str(config)
        return words

    shown = cli(*args_of("config", tiny=False), cwd=PROJECT)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["task"] == TINY["task"]
    trained = cli(*args_of("train"), "--run-dir", str(run_dir), "--set", "log_every=1")
    assert trained.returncode == 0, trained.stderr
    eval_words = args_of("eval")
    eval_words[eval_words.index("--checkpoint") + 1] = str(run_dir / "checkpoints")
    evaluated = cli(*eval_words)
    assert evaluated.returncode == 0, evaluated.stderr
    assert "loss" in json.loads(evaluated.stdout)
    export_words = args_of("export")
    export_words[export_words.index("--checkpoint") + 1] = str(run_dir / "checkpoints")
    export_words[export_words.index("--out") + 1] = str(tmp_path / "model.safetensors")
    exported = cli(*export_words)
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "model.safetensors").stat().st_size > 0
