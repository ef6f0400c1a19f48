"""The `spot task` command: the SkyPilot task file `make train-spot` launches."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from ..cli_common import fail
from ..core.runtime import topology
from ..core.tpu_generations import canonical
from ..pod import commands
from ..pod.cli import Envs, RemoteDir, RemotePython, Rest
from ..pod.defaults import (
    ACCELERATOR_TYPE,
    PACKAGE,
    REMOTE_DIR,
    REMOTE_PYTHON,
    RUNTIME_VERSION,
    SYNC_PATHS,
    ZONE,
)
from ..pod.target import PodError
from .task import (
    SpotError,
    SpotRequest,
    checkpoint_location,
    setup_command,
    task_spec,
    training_args,
)

spot_app = typer.Typer(
    no_args_is_help=True,
    help="Spot TPU runs as SkyPilot managed jobs (make train-spot launches them).",
)

CHECKPOINT_HELP = "gs:// URL of the checkpoints and the run's records (make: CHECKPOINT_DIR)."
ZONE_HELP = "A zone or region to run in; repeat it for the list to fail over to (make: ZONES)."
RESTARTS_HELP = "Relaunches after a training error (preemptions are always relaunched)."


def _literal(dumper: yaml.SafeDumper, text: str) -> Any:
    """Multi-line text (the setup) as a YAML block, the way people write SkyPilot tasks."""
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


class _TaskDumper(yaml.SafeDumper):
    pass


_TaskDumper.add_representer(str, _literal)


@spot_app.command("task")
def task(
    checkpoint_dir: Annotated[str, typer.Option(help=CHECKPOINT_HELP)] = "",
    out: Annotated[Path, typer.Option(help="The task file to write.")] = Path(".sky/task.yaml"),
    name: Annotated[str, typer.Option(help="The managed job's name (make: JOB_NAME).")] = (
        REMOTE_DIR
    ),
    accelerator_type: Annotated[str, typer.Option(help="TPU slice: v5p-64, v6e-8, ...")] = (
        ACCELERATOR_TYPE
    ),
    runtime_version: Annotated[str, typer.Option(help="TPU VM runtime.")] = RUNTIME_VERSION,
    zone: Annotated[list[str] | None, typer.Option(help=ZONE_HELP)] = None,
    spot: Annotated[bool, typer.Option("--spot/--on-demand", help="Spot TPUs.")] = True,
    slices: Annotated[str, typer.Option(help="Slices: one (SkyPilot makes no multislice).")] = "1",
    max_restarts_on_errors: Annotated[int, typer.Option(help=RESTARTS_HELP)] = 3,
    env: Envs = None,
    remote_dir: RemoteDir = REMOTE_DIR,
    python: RemotePython = REMOTE_PYTHON,
    accelerator: Annotated[str, typer.Option(help="tpu, or cpu to rehearse on XLA:CPU.")] = "tpu",
    devices: Annotated[str, typer.Option(help="Devices per host.")] = "all",
    args: Rest = None,
) -> None:
    """Write the SkyPilot task of a spot run: every host runs the line `pod train` sends."""
    if accelerator not in ("tpu", "cpu"):
        fail(f"unknown accelerator {accelerator!r}: choose tpu or cpu")
    request = SpotRequest(
        name, accelerator_type, runtime_version, tuple(zone or [ZONE]), spot, slices,
        max_restarts_on_errors, checkpoint_dir,
    )  # fmt: skip
    try:
        location = checkpoint_location(checkpoint_dir)
        worker_env = commands.forwarded_env(
            os.environ, accelerator, commands.parse_env_pairs(env or [])
        )
        run = commands.worker_train_command(
            PACKAGE, python, accelerator, devices, training_args(args or [], location),
            worker_env, remote_dir,
        )  # fmt: skip
        mounts = {f"{remote_dir}/{path}": path for path in SYNC_PATHS if Path(path).exists()}
        spec = task_spec(request, run, setup_command(python, remote_dir), mounts)
    except (SpotError, PodError) as error:
        fail(str(error))
    if f"{remote_dir}/src" not in mounts:
        fail("run spot task from the project directory (no src/ here)")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.dump(spec, Dumper=_TaskDumper, sort_keys=False, width=1000))
    hosts = topology(canonical(accelerator_type)).hosts
    kind = "spot" if spot else "on-demand"
    places = ", ".join(request.zones)
    tpu = spec["resources"]["accelerators"]
    typer.echo(f"wrote {out}: {tpu} ({hosts} hosts), {kind}, {places}")
    typer.echo(f"checkpoints and records: {location} (records: {location}-records)")
