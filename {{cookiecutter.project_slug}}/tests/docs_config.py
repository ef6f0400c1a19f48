"""Config claims held against the project's own config machinery: `--set` pairs, a command's
config flags, TOML fragments, and the sharding rules among them."""

from __future__ import annotations

import json
{%- if cookiecutter.python_version != "3.10" %}
import tomllib
{%- endif %}
from pathlib import Path
from typing import Any
{%- if cookiecutter.python_version == "3.10" %}

import tomli as tomllib
{%- endif %}

from docs_claims import INLINE, is_placeholder
from docs_report import ClaimCheck


class ConfigChecks(ClaimCheck):
    """A page's config keys, values and sharding rules."""

    def config(self, sets: list[str], flags: dict[str, Any], config_file: Any, where: str) -> None:
        """`--set` pairs and config flags over a config file, through the project's own
        config machinery."""
        cfg = self.project.config_module
        overrides: dict[str, Any] = {}
        for item in sets:
            if is_placeholder(item) or (where == INLINE and "=" not in item):
                continue  # `--set KEY=VALUE`; or inline code that shows a command's start
            try:
                key, value = cfg.parse_override(item)
            except ValueError as error:
                self.fail("config", item, str(error))
                continue
            overrides[key] = value
        overrides.update(flags)
        self.count("keys", len(overrides))
        path = self.project.root / str(config_file) if config_file else None
        known_file = path if path is not None and path.is_file() else None  # else: the reader's
        shown = [f"--set {item}" for item in sets]
        shown += [f"--{key.replace('_', '-')} {value}" for key, value in flags.items()]
        self.settle(known_file, overrides, " ".join(shown) or "the defaults")

    def toml_block(self, text: str) -> None:
        try:
            fragment = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            self.fail("config", "toml block", f"does not parse: {error}")
            return
        if {"project", "tool", "build-system"} & set(fragment):
            return  # a pyproject.toml, not a config
        self.count("keys", count_keys(fragment))
        for key in sorted(set(fragment) - set(self.project.config_keys)):
            self.fail("config", key, "not a config key")
        known = {key: value for key, value in fragment.items() if key in self.project.config_keys}
        self.page_config = known
        self.settle(None, known, "toml block")

    def inline_fragment(self, text: str) -> None:
        """Inline `key = value` (TOML) whose key is a config key: a fragment of the config,
        taken alone or in the page's last config block (`objective = "dpo"` needs its table)."""
        try:
            fragment = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            return
        if fragment and set(fragment) <= set(self.project.config_keys):
            self.count("keys", count_keys(fragment))
            context = getattr(self, "page_config", {})
            if context and self.project.refuses_config(None, fragment)[0]:
                fragment = {**context, **fragment}
            self.settle(None, fragment, text)

    def settle(self, path: Path | None, overrides: dict[str, Any], item: str) -> None:
        """Build and validate the config; then its mesh, strategy, task options and sharding
        rules, each as the project checks them."""
        data = overrides.get("data")
        if isinstance(data, str) and not data.startswith("hf:") and "://" not in data:
            overrides = {**overrides, "data": ""}  # a run-time path, not the project's
        refused, config = self.project.refuses_config(path, overrides)
        if refused:
            self.fail("config", item, refused)
            return
        if config is None:
            self.count("unchecked configs")  # it needs an extra this environment lacks
            return
        if config.sharding_rules:
            self.rules(config)

    def rules(self, config: Any) -> None:
        try:
            rules = self.project.sharding.parse_rules(config.sharding_rules, "sharding_rules")
        except ValueError as error:
            self.fail("rules", json.dumps(config.sharding_rules), str(error))
            return
        names = self.project.parameter_names(config)
        self.count("rules", len(rules))
        if names is None:
            self.count("unchecked rules", len(rules))
            return
        plain = [self.project.sharding._plain(name) for name in names]
        example = names[min(1, len(names) - 1)]
        for rule in rules:
            if not any(rule.matches(name) for name in plain):
                why = f"matches no parameter of the {config.task!r} model (names like {example!r})"
                self.fail("rules", rule.pattern, why)


def count_keys(fragment: dict[str, Any]) -> int:
    """Keys of a TOML fragment, those of its tables too."""
    return sum(1 + (count_keys(v) if isinstance(v, dict) else 0) for v in fragment.values())
