"""What every pod command shares: the slices and their workers, validated once, and the launch."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import typer

from ..cli_common import fail
from ..core.multislice import multislice_environment
from ..core.runtime import RuntimeConfigError, topology
from . import commands, fanout
from .slices import Host, hosts, nodes, requested_slices
from .target import PodError, describe_workers, endpoints, make_target

Command = str | Callable[[Host], str]


class Launch:
    """The settings every pod command shares, validated once: every worker of every slice."""

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
        slices: str = "1",
    ) -> None:
        try:
            self.target = make_target(tpu, zone, project, gcloud)
            self.slices = requested_slices(slices, accelerator_type)
        except PodError as error:
            fail(str(error))
        if (workers is not None and workers < 1) or batch_size < 1:
            fail("--workers and --batch-size must be positive")
        self.batch_size = batch_size
        self.dry_run = dry_run
        self.nodes = nodes(self.target, self.slices)
        # Each slice's worker addresses, from describe (none when it was not asked).
        self.addresses: list[list[str]] = [[] for _ in self.nodes]
        counts = [workers] * len(self.nodes) if workers else self._count(accelerator_type)
        self.hosts = hosts(self.nodes, counts)

    def _count(self, accelerator_type: str) -> list[int]:
        """Each slice's workers: from describe (which also gives their addresses), else from
        the accelerator type."""
        try:
            if self.dry_run:
                if not accelerator_type:
                    raise PodError("--dry-run needs --workers N or --accelerator-type TYPE")
                return [topology(accelerator_type).hosts] * len(self.nodes)
            with ThreadPoolExecutor(max_workers=min(len(self.nodes), 16)) as pool:
                found = list(
                    pool.map(lambda node: describe_workers(node, accelerator_type), self.nodes)
                )
        except (PodError, RuntimeConfigError) as error:
            fail(str(error))
        self.addresses = [addresses for _, addresses in found]
        return [count for count, _ in found]

    def coordinator(self) -> str:
        """The address of worker 0 of slice 0, which coordinates the slices."""
        first = self.nodes[0]
        if self.dry_run:
            return f"<address of {first.name} worker 0>"
        if not self.addresses[0]:
            self.addresses[0], reason = endpoints(first)
            if not self.addresses[0]:
                fail(f"no address for worker 0 of slice 0 ({first.name!r}: {reason})")
        return self.addresses[0][0]

    def environments(
        self, envs: list[str] | None, accelerator: str = "tpu"
    ) -> Callable[[Host], dict[str, str]]:
        """Each host's environment: local XLA/PJRT/TPU/LIBTPU settings < PJRT_DEVICE <
        the multislice variables of its slice < --env pairs."""
        try:
            pairs = commands.parse_env_pairs(envs or [])
        except PodError as error:
            fail(str(error))
        base = commands.forwarded_env(os.environ, accelerator)
        if self.slices == 1:
            return lambda host: {**base, **pairs}
        address = self.coordinator()
        per_slice = [multislice_environment(address, self.slices, s) for s in range(self.slices)]
        return lambda host: {**base, **per_slice[host.slice], **pairs}

    def run(self, command: Command, fail_fast: bool = True) -> fanout.Outcome:
        """Run a shell line (or each host's own) on every worker (or print the ssh commands)."""
        if self.dry_run:
            for host in self.hosts:
                line = command if isinstance(command, str) else command(host)
                typer.echo(shlex.join(host.target.ssh(host.worker, line)))
            return self._all_done()
        try:
            return fanout.run_on_workers(self.hosts, command, self.batch_size, fail_fast=fail_fast)
        except PodError as error:
            fail(str(error))

    def copy(self, sources: list[str], destination: str) -> fanout.Outcome:
        """Copy local paths to every worker (or print the scp commands)."""
        if self.dry_run:
            for host in self.hosts:
                typer.echo(shlex.join(host.target.scp(host.worker, sources, destination)))
            return self._all_done()
        try:
            return fanout.copy_to_workers(self.hosts, sources, destination, self.batch_size)
        except PodError as error:
            fail(str(error))

    def _all_done(self) -> fanout.Outcome:
        labels = tuple(host.label for host in self.hosts)
        return fanout.Outcome(dict.fromkeys(range(len(self.hosts)), 0), (), labels)

    def finish(self, outcome: fanout.Outcome) -> None:
        if not self.dry_run:
            typer.echo(outcome.summary(), err=True)
        raise typer.Exit(outcome.exit_code)


def launcher() -> str:
    """POD_LAUNCHER: `gcloud` (default), or `xla_dist` where the backend still has it."""
    choice = os.environ.get("POD_LAUNCHER", "gcloud")
    if choice not in ("gcloud", "xla_dist"):
        fail(f"unknown POD_LAUNCHER {choice!r}: use gcloud (default) or xla_dist")
    if choice == "gcloud":
        return choice
    from ..core.doctor import legacy_launcher_problem

    problem = legacy_launcher_problem()
    if problem is not None:
        fail(problem)
    return choice


def legacy_launcher(
    launch: Launch, command: list[str], env: Callable[[Host], dict[str, str]], image: str
) -> None:
    """Hand the launch to xla_dist when POD_LAUNCHER=xla_dist (torch_xla <= 2.0 images)."""
    if launcher() == "gcloud":
        return
    if launch.slices > 1:
        fail("POD_LAUNCHER=xla_dist starts one slice: unset POD_LAUNCHER to launch several")
    argv = commands.xla_dist_command(launch.target, command, env(launch.hosts[0]), image)
    if launch.dry_run:
        typer.echo(shlex.join(argv))
        raise typer.Exit(0)
    raise typer.Exit(subprocess.run(argv, check=False).returncode)
