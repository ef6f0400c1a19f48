"""What every command shares: its exit codes, the one-line error, and the run's config.

Below every command module (`cli.py`, `data/cli.py`, `planning/cli.py`, `pod/`, `spot/`,
`goodput/`), so none of them imports another to reach these.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import typer

from .exit_codes import (  # noqa: F401 (what every command imports from here)
    EXIT_CHECKPOINT,
    EXIT_DIVERGED,
    EXIT_OF_STATUS,
    EXIT_PREEMPTED,
    EXIT_USAGE,
)


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
