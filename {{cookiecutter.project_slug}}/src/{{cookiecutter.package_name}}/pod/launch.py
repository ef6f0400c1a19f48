"""What every pod command shares: the target and its workers, validated once, and the launch."""

from __future__ import annotations

import os
import shlex
import subprocess
from typing import NoReturn

import typer

from ..core.runtime import RuntimeConfigError, topology
from . import commands, fanout
from .target import PodError, make_target, worker_count


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
            self.target = make_target(tpu, zone, project, gcloud)
        except PodError as error:
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
                    raise PodError("--dry-run needs --workers N or --accelerator-type TYPE")
                return topology(accelerator_type).hosts
            return worker_count(self.target, accelerator_type)
        except (PodError, RuntimeConfigError) as error:
            fail(str(error))

    def run(self, command: str, fail_fast: bool = True) -> fanout.Outcome:
        """Run a shell line on every worker (or print the ssh commands)."""
        if self.dry_run:
            for worker in range(self.workers):
                typer.echo(shlex.join(self.target.ssh(worker, command)))
            return fanout.Outcome({w: 0 for w in range(self.workers)})
        try:
            return fanout.run_on_workers(
                self.target, command, self.workers, self.batch_size, fail_fast=fail_fast
            )
        except PodError as error:
            fail(str(error))

    def copy(self, sources: list[str], destination: str) -> fanout.Outcome:
        """Copy local paths to every worker (or print the scp commands)."""
        if self.dry_run:
            for worker in range(self.workers):
                typer.echo(shlex.join(self.target.scp(worker, sources, destination)))
            return fanout.Outcome({w: 0 for w in range(self.workers)})
        try:
            return fanout.copy_to_workers(
                self.target, sources, destination, self.workers, self.batch_size
            )
        except PodError as error:
            fail(str(error))

    def finish(self, outcome: fanout.Outcome) -> None:
        if not self.dry_run:
            typer.echo(outcome.summary(), err=True)
        raise typer.Exit(outcome.exit_code)


def environment(envs: list[str] | None, accelerator: str = "tpu") -> dict[str, str]:
    try:
        return commands.forwarded_env(os.environ, accelerator, commands.parse_env_pairs(envs or []))
    except PodError as error:
        fail(str(error))


def launcher() -> str:
    """POD_LAUNCHER: `gcloud` (default), or `xla_dist` when this torch_xla still has it."""
    choice = os.environ.get("POD_LAUNCHER", "gcloud")
    if choice not in ("gcloud", "xla_dist"):
        fail(f"unknown POD_LAUNCHER {choice!r}: use gcloud (default) or xla_dist")
    if choice == "gcloud":
        return choice
    from ..core.doctor import xla_dist_available, xla_version

    if not xla_dist_available():
        fail(
            f"POD_LAUNCHER=xla_dist needs torch_xla.distributed.xla_dist, which torch_xla "
            f"{xla_version() or '(not installed)'} does not have (it left with XRT after 2.0): "
            "unset POD_LAUNCHER to launch through gcloud ssh"
        )
    return choice


def legacy_launcher(launch: Launch, command: list[str], env: dict[str, str], image: str) -> None:
    """Hand the launch to xla_dist when POD_LAUNCHER=xla_dist (torch_xla <= 2.0 images)."""
    if launcher() == "gcloud":
        return
    argv = commands.xla_dist_command(launch.target, command, env, image)
    if launch.dry_run:
        typer.echo(shlex.join(argv))
        raise typer.Exit(0)
    raise typer.Exit(subprocess.run(argv, check=False).returncode)
