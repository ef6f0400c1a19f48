"""What every command shares: its exit codes, the one-line error, and the run's config.

Below every command module (`cli.py`, `data/cli.py`, `planning/cli.py`, `pod/`, `spot/`,
`goodput/`), so none of them imports another to reach these.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import typer

# Exit codes: 2 a usage or configuration error, 3 training diverged (NaN/inf), 4 a checkpoint
# could not be written (the previous one is kept), 75 stopped by SIGTERM after saving
# (EX_TEMPFAIL: not finished; the same command continues it). A run stopped by a preemption
# must not exit 0: a supervisor (SkyPilot, a Kubernetes Job) takes 0 for "done".
EXIT_USAGE, EXIT_DIVERGED, EXIT_CHECKPOINT, EXIT_PREEMPTED = 2, 3, 4, 75
# The exit code of each way a run that trained can end.
EXIT_OF_STATUS = {"completed": 0, "preempted": EXIT_PREEMPTED, "diverged": EXIT_DIVERGED}


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """One clear line on stderr and a non-zero exit code (2: a usage error)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def resolve_config(config_file: Path | None, sets: list[str] | None, flags: dict[str, Any]) -> Any:
    """The run's config: defaults < file < --set pairs < flags; a bad one fails in one line."""
    from .training.config import ConfigError, build_config, parse_override

    try:
        overrides = dict(parse_override(item) for item in sets or [])
        overrides.update({k: v for k, v in flags.items() if v is not None})
        return build_config(config_file, overrides)
    except ConfigError as error:
        fail(str(error))
