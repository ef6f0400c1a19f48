"""The `pod` commands (run, sync, train, kill, status): the same command on every TPU worker."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from . import pod
from .core.runtime import RuntimeConfigError, topology

pod_app = typer.Typer(
    no_args_is_help=True,
    help="Run commands on every worker of a TPU pod (gcloud tpu-vm ssh/scp).",
)

PACKAGE = "{{ cookiecutter.package_name }}"
ZONE = "{{ cookiecutter.zone }}"
PROJECT = "{{ cookiecutter.gcp_project }}"
REMOTE_DIR = "{{ cookiecutter.project_slug }}"
REMOTE_PYTHON = "/opt/{{ cookiecutter.project_slug }}/.venv/bin/python"
MARKER = "/var/lib/{{ cookiecutter.project_slug }}/startup.done"
STARTUP_LOG = "/var/log/{{ cookiecutter.project_slug }}-startup.log"
SYNC_PATHS = ("pyproject.toml", "README.md", "Makefile", "src", "configs", "scripts")

Tpu = Annotated[str, typer.Option("--tpu", help="TPU VM name (make: TPU_NAME).")]
Zone = Annotated[str, typer.Option(help="Zone of the TPU.")]
Project = Annotated[str, typer.Option(help="Google Cloud project (empty: gcloud's default).")]
Gcloud = Annotated[str, typer.Option(envvar="GCLOUD", help="The gcloud command to use.")]
Workers = Annotated[
    int | None, typer.Option(help="Worker count (default: from describe, else the type).")
]
AcceleratorType = Annotated[
    str, typer.Option(help="Accelerator type, for the worker count when describe fails.")
]
BatchSize = Annotated[int, typer.Option(help="ssh connections opened at a time.")]
Envs = Annotated[
    list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE for every worker (repeat).")
]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Print the commands, run nothing.")]
RemoteDir = Annotated[str, typer.Option(help="Project directory on the workers (from home).")]
RemotePython = Annotated[str, typer.Option("--python", help="Python on the workers.")]
Rest = Annotated[list[str] | None, typer.Argument(help="After `--`: passed through.")]


def fail(message: str) -> NoReturn:
    """One clear line on stderr and exit code 2 (a usage error)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


class Launch:
    """The settings every pod command shares, validated once."""

    def __init__(
        self,
        tpu: str,
        zone: str,
        project: str,
        gcloud: str,
        workers: int | None,
        accelerator_type: str,
        batch_size: int,
        dry_run: bool,
    ) -> None:
        try:
            self.target = pod.make_target(tpu, zone, project, gcloud)
        except pod.PodError as error:
            fail(str(error))
        if (workers is not None and workers < 1) or batch_size < 1:
            fail("--workers and --batch-size must be positive")
        self.batch_size = batch_size
        self.dry_run = dry_run
        self.workers = workers or self._count(accelerator_type)

    def _count(self, accelerator_type: str) -> int:
        try:
            if self.dry_run:
                if not accelerator_type:
                    raise pod.PodError("--dry-run needs --workers N or --accelerator-type TYPE")
                return topology(accelerator_type).hosts
            return pod.worker_count(self.target, accelerator_type)
        except (pod.PodError, RuntimeConfigError) as error:
            fail(str(error))

    def run(self, command: str, fail_fast: bool = True) -> pod.Outcome:
        """Run a shell line on every worker (or print the ssh commands)."""
        if self.dry_run:
            for worker in range(self.workers):
                typer.echo(shlex.join(self.target.ssh(worker, command)))
            return pod.Outcome({w: 0 for w in range(self.workers)})
        try:
            return pod.run_on_workers(
                self.target, command, self.workers, self.batch_size, fail_fast=fail_fast
            )
        except pod.PodError as error:
            fail(str(error))

    def copy(self, sources: list[str], destination: str) -> pod.Outcome:
        """Copy local paths to every worker (or print the scp commands)."""
        if self.dry_run:
            for worker in range(self.workers):
                typer.echo(shlex.join(self.target.scp(worker, sources, destination)))
            return pod.Outcome({w: 0 for w in range(self.workers)})
        try:
            return pod.copy_to_workers(
                self.target, sources, destination, self.workers, self.batch_size
            )
        except pod.PodError as error:
            fail(str(error))

    def finish(self, outcome: pod.Outcome) -> None:
        if not self.dry_run:
            typer.echo(outcome.summary(), err=True)
        raise typer.Exit(outcome.exit_code)


def _env(envs: list[str] | None, accelerator: str = "tpu") -> dict[str, str]:
    try:
        return pod.forwarded_env(os.environ, accelerator, pod.parse_env_pairs(envs or []))
    except pod.PodError as error:
        fail(str(error))


def _launcher() -> str:
    """POD_LAUNCHER: `gcloud` (default), or `xla_dist` when this torch_xla still has it."""
    choice = os.environ.get("POD_LAUNCHER", "gcloud")
    if choice not in ("gcloud", "xla_dist"):
        fail(f"unknown POD_LAUNCHER {choice!r}: use gcloud (default) or xla_dist")
    if choice == "gcloud":
        return choice
    from .core.doctor import xla_dist_available, xla_version

    if not xla_dist_available():
        fail(
            f"POD_LAUNCHER=xla_dist needs torch_xla.distributed.xla_dist, which torch_xla "
            f"{xla_version() or '(not installed)'} does not have (it left with XRT after 2.0): "
            "unset POD_LAUNCHER to launch through gcloud ssh"
        )
    return choice


def _legacy_launcher(launch: Launch, command: list[str], env: dict[str, str], image: str) -> None:
    """Hand the launch to xla_dist when POD_LAUNCHER=xla_dist (torch_xla <= 2.0 images)."""
    if _launcher() == "gcloud":
        return
    argv = pod.xla_dist_command(launch.target, command, env, image)
    if launch.dry_run:
        typer.echo(shlex.join(argv))
        raise typer.Exit(0)
    raise typer.Exit(subprocess.run(argv, check=False).returncode)


@pod_app.command("run")
def run(
    tpu: Tpu = "",
    zone: Zone = ZONE,
    project: Project = PROJECT,
    gcloud: Gcloud = "gcloud",
    workers: Workers = None,
    accelerator_type: AcceleratorType = "",
    batch_size: BatchSize = 64,
    env: Envs = None,
    dry_run: DryRun = False,
    command: Rest = None,
) -> None:
    """Run a shell command on every worker; stop them all when one fails."""
    if not command:
        fail("no command: pod run [OPTIONS] -- COMMAND")
    _launcher()
    launch = Launch(tpu, zone, project, gcloud, workers, accelerator_type, batch_size, dry_run)
    environment = _env(env)
    _legacy_launcher(launch, ["bash", "-c", " ".join(command)], environment, "")
    launch.finish(launch.run(pod.remote_command(" ".join(command), environment)))


@pod_app.command("sync")
def sync(
    tpu: Tpu = "",
    zone: Zone = ZONE,
    project: Project = PROJECT,
    gcloud: Gcloud = "gcloud",
    workers: Workers = None,
    accelerator_type: AcceleratorType = "",
    batch_size: BatchSize = 64,
    dry_run: DryRun = False,
    remote_dir: RemoteDir = REMOTE_DIR,
    python: RemotePython = REMOTE_PYTHON,
    install: Annotated[
        bool, typer.Option(help="pip install the project into --python after copying.")
    ] = True,
) -> None:
    """Copy the project (src, configs, scripts, pyproject.toml...) to every worker."""
    sources = [name for name in SYNC_PATHS if Path(name).exists()]
    if "src" not in sources:
        fail("run pod sync from the project directory (no src/ here)")
    launch = Launch(tpu, zone, project, gcloud, workers, accelerator_type, batch_size, dry_run)
    prepared = launch.run(f"mkdir -p {shlex.quote(remote_dir)}")
    if prepared.exit_code:
        launch.finish(prepared)
    copied = launch.copy(sources, remote_dir + "/")
    if copied.exit_code:
        typer.echo("pod: copying to the workers failed", err=True)
        launch.finish(copied)
    if not install:
        launch.finish(copied)
    launch.finish(launch.run(pod.remote_command(pod.install_command(python), {}, remote_dir)))


@pod_app.command("train")
def train(
    tpu: Tpu = "",
    zone: Zone = ZONE,
    project: Project = PROJECT,
    gcloud: Gcloud = "gcloud",
    workers: Workers = None,
    accelerator_type: AcceleratorType = "",
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
    args: Rest = None,
) -> None:
    """Train on every worker at once (run `pod sync` first, or use --docker)."""
    if accelerator not in ("tpu", "cpu"):
        fail(f"unknown accelerator {accelerator!r}: choose tpu or cpu")
    _launcher()
    launch = Launch(tpu, zone, project, gcloud, workers, accelerator_type, batch_size, dry_run)
    environment = _env(env, accelerator)
    cli_args = ["train", "--accelerator", accelerator, "--devices", devices, *(args or [])]
    _legacy_launcher(launch, [python, "-m", PACKAGE, *cli_args], environment, docker)
    if docker:
        command = pod.docker_command(docker, environment, cli_args)
    else:
        line = pod.train_command(PACKAGE, python, accelerator, devices, args or [])
        command = pod.remote_command(line, environment, remote_dir)
    outcome = launch.run(command)
    if outcome.exit_code and cleanup and not dry_run:
        typer.echo("pod: freeing the TPU on every worker", err=True)
        launch.run(pod.kill_command(), fail_fast=False)
    launch.finish(outcome)


@pod_app.command("kill")
def kill(
    tpu: Tpu = "",
    zone: Zone = ZONE,
    project: Project = PROJECT,
    gcloud: Gcloud = "gcloud",
    workers: Workers = None,
    accelerator_type: AcceleratorType = "",
    batch_size: BatchSize = 64,
    dry_run: DryRun = False,
    device: Annotated[
        list[str] | None, typer.Option(help="Device file globs (default /dev/accel*, /dev/vfio/*).")
    ] = None,
    lockfile: Annotated[str, typer.Option(help="The libtpu lockfile to remove.")] = (
        pod.LIBTPU_LOCKFILE
    ),
) -> None:
    """Free the TPU on every worker: stop the holders of its device files, drop the lockfile."""
    launch = Launch(tpu, zone, project, gcloud, workers, accelerator_type, batch_size, dry_run)
    command = pod.kill_command(lockfile, device or pod.DEVICE_PATTERNS)
    launch.finish(launch.run(command, fail_fast=False))


@pod_app.command("status")
def status(
    tpu: Tpu = "",
    zone: Zone = ZONE,
    project: Project = PROJECT,
    gcloud: Gcloud = "gcloud",
    workers: Workers = None,
    accelerator_type: AcceleratorType = "",
    batch_size: BatchSize = 64,
    dry_run: DryRun = False,
    marker: Annotated[str, typer.Option(help="The startup script's completion marker.")] = MARKER,
    log: Annotated[str, typer.Option(help="The startup script's log.")] = STARTUP_LOG,
) -> None:
    """Tell which workers finished the startup script (exit 1 until all have)."""
    launch = Launch(tpu, zone, project, gcloud, workers, accelerator_type, batch_size, dry_run)
    outcome = launch.run(pod.status_command(marker, log), fail_fast=False)
    if dry_run:
        raise typer.Exit(0)
    ready = sum(1 for code in outcome.codes.values() if code == 0)
    typer.echo(f"pod: {ready}/{len(outcome.codes)} workers ready", err=True)
    raise typer.Exit(0 if ready == len(outcome.codes) else 1)
