"""The `pod` commands (run, sync, train, kill, status, nodes): one command on every worker of
every slice of a TPU."""

from __future__ import annotations

import shlex
{%- if cookiecutter.python_version != "3.10" %}
import tomllib
{%- endif %}
from pathlib import Path
from typing import Annotated
{% if cookiecutter.python_version == "3.10" %}
import tomli as tomllib
{%- endif %}
import typer

from ..cli_common import fail
from . import commands
from .defaults import (
    MARKER,
    PACKAGE,
    PROJECT,
    REMOTE_DIR,
    REMOTE_PYTHON,
    STARTUP_LOG,
    SYNC_PATHS,
    ZONE,
)
from .launch import Launch, launcher, legacy_launcher
from .slices import Host, nodes, requested_slices
from .target import PodError, make_target

pod_app = typer.Typer(
    no_args_is_help=True,
    help="Run commands on every worker of a TPU pod (gcloud tpu-vm ssh/scp).",
)


Tpu = Annotated[str, typer.Option("--tpu", help="TPU VM name (make: TPU_NAME).")]
Zone = Annotated[str, typer.Option(help="Zone of the TPU.")]
Project = Annotated[str, typer.Option(help="Google Cloud project (empty: gcloud's default).")]
Gcloud = Annotated[str, typer.Option(envvar="GCLOUD", help="The gcloud command to use.")]
Workers = Annotated[
    int | None,
    typer.Option(help="Workers of each slice (default: from describe, else the type)."),
]
Slices = Annotated[
    str,
    typer.Option(help="Slices (make: SLICES): N > 1 reaches the nodes NAME-0 ... NAME-(N-1)."),
]
AcceleratorType = Annotated[
    str,
    typer.Option(help="Accelerator type: the worker count when describe fails; checks --slices."),
]
BatchSize = Annotated[int, typer.Option(help="ssh connections opened at a time.")]
Envs = Annotated[
    list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE for every worker (repeat).")
]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Print the commands, run nothing.")]
RemoteDir = Annotated[str, typer.Option(help="Project directory on the workers (from home).")]
RemotePython = Annotated[str, typer.Option("--python", help="Python on the workers.")]
Rest = Annotated[list[str] | None, typer.Argument(help="After `--`: passed through.")]


@pod_app.command("run")
def run(
    tpu: Tpu = "",
    zone: Zone = ZONE,
    project: Project = PROJECT,
    gcloud: Gcloud = "gcloud",
    workers: Workers = None,
    accelerator_type: AcceleratorType = "",
    slices: Slices = "1",
    batch_size: BatchSize = 64,
    env: Envs = None,
    dry_run: DryRun = False,
    command: Rest = None,
) -> None:
    """Run a shell command on every worker; stop them all when one fails."""
    if not command:
        fail("no command: pod run [OPTIONS] -- COMMAND")
    launcher()
    launch = Launch(
        tpu, zone, project, gcloud, workers, accelerator_type, batch_size, dry_run, slices
    )
    env_of = launch.environments(env)
    legacy_launcher(launch, ["bash", "-c", " ".join(command)], env_of, "")
    line = " ".join(command)
    launch.finish(launch.run(lambda host: commands.remote_command(line, env_of(host))))


def project_extras() -> list[str]:
    """The extras the project offers (its pyproject.toml, where `pod sync` copies from)."""
    with open("pyproject.toml", "rb") as file:
        project = tomllib.load(file)["project"]
    return sorted(project.get("optional-dependencies", {}))


@pod_app.command("sync")
def sync(
    tpu: Tpu = "",
    zone: Zone = ZONE,
    project: Project = PROJECT,
    gcloud: Gcloud = "gcloud",
    workers: Workers = None,
    accelerator_type: AcceleratorType = "",
    slices: Slices = "1",
    batch_size: BatchSize = 64,
    dry_run: DryRun = False,
    remote_dir: RemoteDir = REMOTE_DIR,
    python: RemotePython = REMOTE_PYTHON,
    install: Annotated[
        bool, typer.Option(help="pip install the project into --python after copying.")
    ] = True,
    extras: Annotated[
        str, typer.Option(help="The project's extras to install with it: wandb, or wandb,hf.")
    ] = "",
) -> None:
    """Copy the project (src, configs, scripts, pyproject.toml...) to every worker."""
    sources = [name for name in SYNC_PATHS if Path(name).exists()]
    if "src" not in sources:
        fail("run pod sync from the project directory (no src/ here)")
    wanted = [name.strip() for name in extras.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in project_extras()]
    if unknown:
        fail(f"the project has no extra {unknown[0]!r}: use {', '.join(project_extras())}")
    launch = Launch(
        tpu, zone, project, gcloud, workers, accelerator_type, batch_size, dry_run, slices
    )
    prepared = launch.run(f"mkdir -p {shlex.quote(remote_dir)}")
    if prepared.exit_code:
        launch.finish(prepared)
    copied = launch.copy(sources, remote_dir + "/")
    if copied.exit_code:
        typer.echo("pod: copying to the workers failed", err=True)
        launch.finish(copied)
    if not install:
        launch.finish(copied)
    install_line = commands.remote_command(commands.install_command(python, wanted), {}, remote_dir)
    launch.finish(launch.run(install_line))


# What `pod train --command` runs on every worker: the first process of the job writes.
POD_COMMANDS = ("train", "generate", "eval")


@pod_app.command("train")
def train(
    tpu: Tpu = "",
    zone: Zone = ZONE,
    project: Project = PROJECT,
    gcloud: Gcloud = "gcloud",
    workers: Workers = None,
    accelerator_type: AcceleratorType = "",
    slices: Slices = "1",
    batch_size: BatchSize = 64,
    env: Envs = None,
    dry_run: DryRun = False,
    remote_dir: RemoteDir = REMOTE_DIR,
    python: RemotePython = REMOTE_PYTHON,
    accelerator: Annotated[
        str, typer.Option(help="tpu, or cpu to rehearse on XLA:CPU (sets PJRT_DEVICE).")
    ] = "tpu",
    devices: Annotated[str, typer.Option(help="Devices per worker.")] = "all",
    docker: Annotated[
        str, typer.Option(help="Run this image (entrypoint: the CLI) instead of the code.")
    ] = "",
    cleanup: Annotated[
        bool, typer.Option(help="After a failure, free the TPU on every worker (pod kill).")
    ] = True,
    subcommand: Annotated[
        str, typer.Option("--command", help="What every worker runs: train, generate or eval.")
    ] = "train",
    args: Rest = None,
) -> None:
    """Train on every worker at once (run `pod sync` first, or use --docker)."""
    if accelerator not in ("tpu", "cpu"):
        fail(f"unknown accelerator {accelerator!r}: choose tpu or cpu")
    if subcommand not in POD_COMMANDS:
        fail(f"unknown command {subcommand!r}: choose {', '.join(POD_COMMANDS)}")
    launcher()
    launch = Launch(
        tpu, zone, project, gcloud, workers, accelerator_type, batch_size, dry_run, slices
    )
    env_of = launch.environments(env, accelerator)
    cli_args = [subcommand, "--accelerator", accelerator, "--devices", devices, *(args or [])]
    legacy_launcher(launch, [python, "-m", PACKAGE, *cli_args], env_of, docker)

    def command(host: Host) -> str:
        if docker:
            return commands.docker_command(docker, env_of(host), cli_args)
        return commands.worker_train_command(
            PACKAGE, python, accelerator, devices, args or [], env_of(host), remote_dir, subcommand
        )

    outcome = launch.run(command)
    if outcome.exit_code and cleanup and not dry_run:
        typer.echo("pod: freeing the TPU on every worker", err=True)
        launch.run(commands.kill_command(), fail_fast=False)
    launch.finish(outcome)


@pod_app.command("kill")
def kill(
    tpu: Tpu = "",
    zone: Zone = ZONE,
    project: Project = PROJECT,
    gcloud: Gcloud = "gcloud",
    workers: Workers = None,
    accelerator_type: AcceleratorType = "",
    slices: Slices = "1",
    batch_size: BatchSize = 64,
    dry_run: DryRun = False,
    device: Annotated[
        list[str] | None, typer.Option(help="Device file globs (default /dev/accel*, /dev/vfio/*).")
    ] = None,
    lockfile: Annotated[str, typer.Option(help="The libtpu lockfile to remove.")] = (
        commands.LIBTPU_LOCKFILE
    ),
) -> None:
    """Free the TPU on every worker: stop the holders of its device files, drop the lockfile."""
    launch = Launch(
        tpu, zone, project, gcloud, workers, accelerator_type, batch_size, dry_run, slices
    )
    command = commands.kill_command(lockfile, device or commands.DEVICE_PATTERNS)
    launch.finish(launch.run(command, fail_fast=False))


@pod_app.command("status")
def status(
    tpu: Tpu = "",
    zone: Zone = ZONE,
    project: Project = PROJECT,
    gcloud: Gcloud = "gcloud",
    workers: Workers = None,
    accelerator_type: AcceleratorType = "",
    slices: Slices = "1",
    batch_size: BatchSize = 64,
    dry_run: DryRun = False,
    marker: Annotated[str, typer.Option(help="The startup script's completion marker.")] = MARKER,
    log: Annotated[str, typer.Option(help="The startup script's log.")] = STARTUP_LOG,
) -> None:
    """Tell which workers finished the startup script (exit 1 until all have)."""
    launch = Launch(
        tpu, zone, project, gcloud, workers, accelerator_type, batch_size, dry_run, slices
    )
    outcome = launch.run(commands.status_command(marker, log), fail_fast=False)
    if dry_run:
        raise typer.Exit(0)
    ready = sum(1 for code in outcome.codes.values() if code == 0)
    typer.echo(f"pod: {ready}/{len(outcome.codes)} workers ready", err=True)
    raise typer.Exit(0 if ready == len(outcome.codes) else 1)


@pod_app.command("nodes")
def list_nodes(
    tpu: Tpu = "",
    zone: Zone = ZONE,
    project: Project = PROJECT,
    accelerator_type: AcceleratorType = "",
    slices: Slices = "1",
) -> None:
    """Print the TPU node of each slice; refuse a slice count the accelerator type cannot form."""
    try:
        target = make_target(tpu, zone, project, "gcloud")
        for node in nodes(target, requested_slices(slices, accelerator_type)):
            typer.echo(node.name)
    except PodError as error:
        fail(str(error))
