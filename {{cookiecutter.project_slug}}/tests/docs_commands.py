"""Command lines of a page held against the code: the project's CLI through its click command
tree, benchmark scripts through their argparse parsers, make through the Makefile, and the
command lines other tools run."""

from __future__ import annotations

import re
from typing import Any

from docs_claims import INLINE, MENTION, NESTED, is_placeholder, simple_commands, words_of
from docs_click import flag_words, leaves, option_names, with_dummy_values
from docs_config import ConfigChecks
from makefile_facts import ARGS_MARK, make_words

# Programs of others, whose flags are not checked here; any other program is a failure.
OTHERS = {
    "gcloud", "gsutil", "docker", "ray", "sky", "pip", "git", "wandb", "tensorboard", "xpk",
    "kubectl", "curl", "torchrun", "cookiecutter", "cruft", "pre-commit", "pytest", "apt-get",
    "hf", "stress",
}  # fmt: skip
# Shell builtins and the utilities a page may show around the commands it is about.
SHELL = {"cd", "export", "source", "echo", "cat", "ls", "mkdir", "rm", "cp", "kill", "bash", "sh"}
# Modules `python -m` runs that are not the project's.
OTHER_MODULES = {"pip", "pytest", "venv", "torch", "torch_xla", "ray"}
# Where a program takes a whole command line as one option's value.
COMMAND_OPTIONS = {"xpk": "--command", "gcloud": "--command"}
# Project commands whose words after `--` are another command: `pod run` runs them as a shell
# line on every worker; `pod train` and `spot task` hand them to `train`.
INNER: dict[tuple[str, ...], tuple[str, ...] | None] = {
    ("pod", "run"): None, ("pod", "train"): ("train",), ("spot", "task"): ("train",)
}  # fmt: skip
DOCKER_VALUE_OPTIONS = {
    "-e", "--env", "-v", "--volume", "--name", "-p", "--publish", "-w", "--workdir", "-u",
    "--user", "--group-add", "--cap-add", "--device", "--env-file", "--mount", "--network",
    "--shm-size", "--platform",
}  # fmt: skip
USAGE_ERRORS = {"MissingParameter", "BadParameter", "UsageError", "BadOptionUsage",
                "BadArgumentUsage", "NoSuchOption"}  # fmt: skip
PYTHON = re.compile(r"python(3(\.\d+)?)?")


class CommandChecks(ConfigChecks):
    """A page's programs, subcommands, flags, required options and make lines."""

    def shell(self, line: str, where: str) -> None:
        for command in simple_commands(words_of(line)):
            self.command(command, where)

    def is_command(self, words: list[str]) -> bool:
        """Whether inline code is a command line: it starts with a program this check knows."""
        program = self.project.program_name(words[0])
        known = {self.project.slug, "make", *OTHERS, *SHELL}
        if program in known or PYTHON.fullmatch(program):
            return True
        return self.project.is_script(words[0])

    def command(self, words: list[str], where: str) -> None:
        program, args = words[0], words[1:]
        name = self.project.program_name(program)
        self.count("commands")
        if program == self.project.slug:
            self.cli(args, where)
        elif PYTHON.fullmatch(name):
            self.python(args, where)
        elif program == "make":
            self.make(args, where)
        elif self.project.is_script(program):
            self.script(program, args)
        elif name in OTHERS or name in SHELL:
            self.others(name, args, where)
        elif where != INLINE and not is_placeholder(program):
            self.fail("flags", program, f"no such program (the project's is {self.project.slug} "
                      f"or python -m {self.project.package}; nor make, a script of the project, "
                      "or another's tool this check knows)")  # fmt: skip

    def python(self, args: list[str], where: str) -> None:
        if args[:1] == ["-m"] and len(args) > 1:
            module = args[1]
            if module == self.project.package:
                self.cli(args[2:], where)
            elif module.split(".")[0] not in OTHER_MODULES:
                self.fail("flags", f"python -m {module}", "no such module of the project")
        elif args and not args[0].startswith("-"):
            self.script(args[0], args[1:])

    def script(self, path: str, args: list[str]) -> None:
        """A script of the project (its existence is a path claim); a benchmark's flags are
        held against its argparse parser."""
        parser = self.project.parser(path)
        if parser is None:
            return
        flags = [word for word in args if word.startswith("--")]
        self.count("flags", len(flags))
        refused = self.project.refused_by(parser, args)
        if refused:
            self.fail("flags", f"{path} {' '.join(args)}".strip(), refused)

    def others(self, name: str, args: list[str], where: str) -> None:
        """Another tool: its flags are its own; a command line it runs is checked."""
        option = COMMAND_OPTIONS.get(name)
        for index, word in enumerate(args):
            if option and word == option and index + 1 < len(args):
                self.shell(args[index + 1], NESTED)
            elif option and word.startswith(option + "="):
                self.shell(word.split("=", 1)[1], NESTED)
        if name == "docker" and args[:1] == ["run"]:
            rest = docker_run_arguments(args[1:], self.project.image)
            if rest and self.project.image_runs_cli():
                self.cli(rest, where)

    def cli(self, args: list[str], where: str) -> None:
        """The project's command line, through its own click command tree."""
        node: Any = self.project.cli
        path: list[str] = []
        for index, word in enumerate(args):
            if not hasattr(node, "commands"):
                self.leaf(node, path, args[index:], where)
                return
            if word.startswith("-"):
                self.count("flags")
                if word != "--help":
                    self.fail("flags", self.named(path, word), "no such option of the command")
                return
            if is_placeholder(word):  # `pod ... --slices N`: some subcommand takes the flags
                self.flags_of_any(node, path, args[index + 1 :])
                return
            choices = word.split("|")
            unknown = [choice for choice in choices if choice not in node.commands]
            if unknown:
                known = ", ".join(sorted(node.commands))
                self.fail("flags", self.named(path, unknown[0]), f"no such command (has {known})")
                return
            if len(choices) > 1:
                for choice in choices:
                    self.cli([*args[:index], choice, *args[index + 1 :]], where)
                return
            node = node.commands[word]
            path.append(word)
        if not hasattr(node, "commands"):
            self.leaf(node, path, [], where)

    def named(self, path: list[str], word: str = "") -> str:
        return " ".join([self.project.slug, *path, word]).strip()

    def flags_of_any(self, group: Any, path: list[str], args: list[str]) -> None:
        taken = set().union(*(option_names(command) for command in leaves(group)))
        for word in flag_words(args):
            self.count("flags")
            if word.split("=")[0] not in taken:
                self.fail("flags", self.named(path, word), "no subcommand takes it")

    def leaf(self, command: Any, path: list[str], args: list[str], where: str) -> None:
        inner: list[str] | None = None
        if tuple(path) in INNER and "--" in args:
            split = args.index("--")
            args, inner = args[:split], args[split + 1 :]
        names, flags = option_names(command), flag_words(args, command)
        unknown = [word for word in flags if word.split("=")[0] not in names]
        self.count("flags", len(flags))
        for word in unknown:
            self.fail("flags", self.named(path, word.split("=")[0]), "no such option")
        if unknown or where == MENTION or (where == INLINE and not args and inner is None):
            return  # refused already; or the command only named, not run
        rest = ["--", *inner] if inner is not None else []
        params = self.parse(command, path, args + rest, where)
        if params is None:
            return
        if "tpu" in params and "zone" in params:
            refused = self.project.refuses_target(params)
            if refused:
                self.fail("flags", self.named(path), refused)
        if "sets" in params:
            sets = list(params["sets"] or [])
            self.config(sets, params["flags"], params.get("config"), where)
        if inner is not None:
            then = INNER[tuple(path)]
            if then is not None and params.get("subcommand"):  # `pod train --command generate`
                then = (str(params["subcommand"]),)
            if then is None:
                self.shell(" ".join(inner), NESTED)
            else:
                self.cli([*then, *inner], where)

    def parse(
        self, command: Any, path: list[str], args: list[str], where: str
    ) -> dict[str, Any] | None:
        """The parameters click parses from the words (nothing runs), or None where it refuses
        them (a failure, unless inline code shows only a command's start)."""
        try:
            context = command.make_context(path[-1], with_dummy_values(command, args))
        except Exception as error:  # click's (or Typer's own click's) usage errors
            if type(error).__name__ not in USAGE_ERRORS:
                raise
            message = error.format_message() if hasattr(error, "format_message") else str(error)
            prefix = where == INLINE and "requires an argument" in message
            if not prefix:
                self.fail("flags", self.named(path, " ".join(args)), message)
            return None
        params = dict(context.params)
        sources = {name: context.get_parameter_source(name) for name in params}
        params["flags"] = {
            name: value
            for name, value in params.items()
            if name in self.project.config_keys
            and name not in ("config", "sets")
            and getattr(sources.get(name), "name", "") == "COMMANDLINE"
        }
        return params

    # make

    def make(self, args: list[str], where: str) -> None:
        targets, variables = make_words(args)
        makefile = self.project.makefile
        known = [target for target in targets if target in makefile.targets]
        self.count("targets", len(targets))
        for target in targets:
            if target not in makefile.targets:
                self.fail("make", f"make {target}", "the Makefile has no such target")
        read = (
            set().union(*(makefile.reads(target) for target in known))
            if known
            else makefile.read_anywhere()
        )
        self.count("variables", len(variables))
        for name in variables:
            if name not in read:
                whom = f"make {' '.join(known)}" if known else "the Makefile"
                self.fail("make", f"{name}=", f"{whom} never reads {name}")
        if "ARGS" in variables and known and len(known) == len(targets) and "ARGS" in read:
            self.expanded(known, variables)

    def expanded(self, targets: list[str], variables: dict[str, str]) -> None:
        """The commands the targets run with these variables (make's own expansion), the
        docs' ARGS in them, checked as commands of their own."""
        makefile = self.project.makefile
        if any(makefile.recursive(target) for target in targets):
            self.count("unexpanded")
            return
        others = {name: value for name, value in variables.items() if name != "ARGS"}
        try:
            lines = makefile.expand(targets, others)
        except RuntimeError as error:
            self.fail("make", f"make {' '.join(targets)}", f"make refuses: {error}")
            return
        args = words_of(variables["ARGS"])
        for line in lines:
            for command in simple_commands(words_of(line)):
                if ARGS_MARK in command:
                    at = command.index(ARGS_MARK)
                    self.command([*command[:at], *args, *command[at + 1 :]], NESTED)


def docker_run_arguments(args: list[str], image: str) -> list[str]:
    """What `docker run` hands the project's image (`$IMAGE`, or the Makefile's IMAGE)."""
    index = 0
    while index < len(args) and args[index].startswith("-"):
        option = args[index]
        if option == "--entrypoint":
            return []  # another program than the image's own
        index += 2 if option in DOCKER_VALUE_OPTIONS else 1
    if index >= len(args) or args[index] not in ("$IMAGE", "${IMAGE}", image):
        return []
    return args[index + 1 :]
