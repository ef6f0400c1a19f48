"""The error of a configuration that cannot run: below the config and everything it names."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that cannot run; the message says which key and why."""
