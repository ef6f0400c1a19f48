"""What the docs are held against: this project's command tree, benchmark parsers, Makefile,
config machinery, files and example model, each loaded once and asked without running
anything."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import os
import re
import sys
{%- if cookiecutter.python_version != "3.10" %}
import tomllib
{%- endif %}
from functools import cache, cached_property
from pathlib import Path
from typing import Any
{%- if cookiecutter.python_version == "3.10" %}

import tomli as tomllib
{%- endif %}

from docs_claims import PACKAGE_FOLDERS, PROJECT_FOLDERS, is_placeholder
from makefile_facts import Makefile

# Folders of a checkout that are not the project's own files.
NOT_PROJECT = {".git", ".venv", ".venv-sky", "build", "runs", "__pycache__", ".pytest_cache",
               ".mypy_cache", ".ruff_cache", ".sky", ".pod-rehearsal"}  # fmt: skip


class Refused(Exception):
    """An argparse parser's error, raised instead of its exit."""


class Project:
    """The project at `root` (its pyproject.toml names the console script and the CLI)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
        self.slug, entry = next(iter(scripts.items()))
        self.cli_module = entry.split(":")[0]
        self.package = self.cli_module.split(".")[0]
        self.makefile = Makefile(root / "Makefile")
        self._names: dict[str, list[str] | None] = {}

    def module(self, name: str) -> Any:
        return importlib.import_module(f"{self.package}.{name}")

    @cached_property
    def cli(self) -> Any:
        """The root of the click command tree Typer builds from the app."""
        import typer

        return typer.main.get_command(importlib.import_module(self.cli_module).app)

    @cached_property
    def config_module(self) -> Any:
        return self.module("training.config")

    @cached_property
    def config_keys(self) -> set[str]:
        return set(self.config_module.FIELDS)

    @cached_property
    def sharding(self) -> Any:
        return self.module("core.sharding")

    @cached_property
    def files(self) -> tuple[set[str], set[str]]:
        """Every file and folder of the project (relative paths), and every file name."""
        paths: set[str] = set()
        for folder, dirs, names in os.walk(self.root):
            dirs[:] = [d for d in dirs if d not in NOT_PROJECT and not d.endswith(".egg-info")]
            relative = Path(folder).relative_to(self.root)
            paths |= {(relative / name).as_posix() for name in [*dirs, *names]}
        return paths, {path.rsplit("/", 1)[-1] for path in paths}

    def has(self, path: str) -> bool:
        """Whether the project has the file or folder (core/... under src/<package>/, a bare
        name anywhere, a glob matching something)."""
        path = path.removeprefix("./").rstrip("/")
        if "/" not in path:
            return path in self.files[1]
        if path.split("/", 1)[0] in PACKAGE_FOLDERS:
            path = f"src/{self.package}/{path}"
        if "*" in path:
            pattern = re.compile(re.escape(path).replace(r"\*", "[^/]*"))
            return any(pattern.fullmatch(known) for known in self.files[0])
        return path in self.files[0]

    def is_script(self, word: str) -> bool:
        """A script of the project run by its path (`scripts/x.sh`, `benchmarks/x.py`)."""
        path = word.removeprefix("./")
        return path.split("/", 1)[0] in PROJECT_FOLDERS and path.endswith((".py", ".sh"))

    @staticmethod
    def program_name(word: str) -> str:
        """A program's name: `.venv/bin/python` is python."""
        return word.rsplit("/", 1)[-1] if "/bin/" in word or word.startswith("bin/") else word

    @cache  # noqa: B019 (one Project per session)
    def parser(self, script: str) -> argparse.ArgumentParser | None:
        """A benchmark script's argparse parser, from its `parser()` (the module is imported,
        its main never runs); None for other scripts."""
        path = self.root / script.removeprefix("./")
        if path.parent.name != "benchmarks" or path.suffix != ".py" or not path.is_file():
            return None
        sys.path.insert(0, str(path.parent))  # its sibling modules, as when it runs
        try:
            spec = importlib.util.spec_from_file_location(f"docs_check_{path.stem}", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except ImportError:
            return None  # it needs an extra this environment lacks (`.[bench]`, `.[hf]`)
        finally:
            sys.path.remove(str(path.parent))
        made = getattr(module, "parser", None)
        return made() if callable(made) else None

    @staticmethod
    def refused_by(parser: argparse.ArgumentParser, args: list[str]) -> str:
        """argparse's own verdict on the words ("" where it takes them)."""
        if {"-h", "--help"} & set(args):
            return ""
        values = {o: a for a in parser._actions for o in a.option_strings if a.nargs != 0}
        words = []
        for index, word in enumerate(args):
            action = values.get(args[index - 1]) if index else None
            if action is not None and is_placeholder(word) and action.type in (int, float):
                word = "1"  # `--steps N`
            words.append(word)

        def refuse(message: str) -> Any:
            raise Refused(message)

        parser.error = refuse  # type: ignore[method-assign]
        try:
            _, extra = parser.parse_known_args(words)
        except Refused as error:
            return str(error)
        return f"unrecognized arguments: {' '.join(extra)}" if extra else ""

    def refuses_target(self, params: dict[str, Any]) -> str:
        """The pod launcher's own check of the TPU a command reaches ("" where it passes)."""
        target = self.module("pod.target")
        try:
            target.make_target(
                params["tpu"], params["zone"], params.get("project") or "",
                params.get("gcloud") or "gcloud",
            )  # fmt: skip
        except ValueError as error:
            return str(error)
        return ""

    def refuses_config(self, path: Path | None, overrides: dict[str, Any]) -> tuple[str, Any]:
        """(why not, the config): the config built and validated as a run does, then its
        mesh, strategy and task options; a refusal that only asks for an extra this
        environment lacks (`pip install ...`) is not one."""
        try:
            config = self.config_module.build_config(path, overrides)
            if config.mesh:
                self.sharding.parse_mesh(config.mesh)
            choices = self.module("core.strategies").CHOICES
            if config.strategy not in choices:
                return f"unknown strategy {config.strategy!r}: use {', '.join(choices)}", None
            self.task(config.task, json.dumps(config.task_options, sort_keys=True))
        except ValueError as error:
            return ("" if "pip install" in str(error) else str(error)), None
        except ImportError:
            return "", None
        return "", config

    @cache  # noqa: B019
    def task(self, name: str, options: str) -> Any:
        """The project's task built with these options (None for a task the reader writes)."""
        tasks = self.module("tasks")
        if tasks.module_name(name) not in tasks.available():
            return None
        given = {k: v for k, v in json.loads(options).items() if k != "model_name"}
        return tasks.load_task(name, "", given)  # a pretrained model_name is not fetched

    def parameter_names(self, config: Any) -> list[str] | None:
        """The names of the parameters of the config's model, built as `plan` builds it: on
        the meta device, nothing allocated (None for a task the reader writes)."""
        key = json.dumps(dataclasses.asdict(config), sort_keys=True, default=str)
        if key not in self._names:
            self._names[key] = self._parameter_names(config)
        return self._names[key]

    def _parameter_names(self, config: Any) -> list[str] | None:
        import torch

        task = self.task(config.task, json.dumps(config.task_options, sort_keys=True))
        if task is None:
            return None
        build_model = self.module("training.model").build_model
        meta = self.module("weights.meta")
        # A scanned run holds the same parameters; plan builds the unrolled model, as here.
        unrolled = dataclasses.replace(config, scan_layers=False, activation_checkpointing=False)
        with torch.device("meta"), meta.parameters_on_meta():
            model = build_model(task, unrolled)
        return [name for name, _ in model.named_parameters(remove_duplicate=False)]

    @cached_property
    def image(self) -> str:
        """The Makefile's IMAGE: the training image's name."""
        found = re.search(r"^IMAGE \?= (\S+)", (self.root / "Makefile").read_text(), re.M)
        return found.group(1) if found else "$IMAGE"

    def image_runs_cli(self) -> bool:
        """Whether the Dockerfile's entrypoint is the project's CLI (`python -m <package>`)."""
        found = re.search(r"^ENTRYPOINT (\[.*\])", (self.root / "Dockerfile").read_text(), re.M)
        return found is not None and json.loads(found.group(1))[1:] == ["-m", self.package]
