"""Training configuration: defaults, a TOML/YAML file, then command-line overrides."""

from __future__ import annotations

import dataclasses
import importlib.util
{%- if cookiecutter.python_version != "3.10" %}
import tomllib
{%- endif %}
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
{% if cookiecutter.python_version == "3.10" %}
import tomli as tomllib
{%- endif %}
import yaml

from .errors import ConfigError

GOODPUT_MODES = ("local", "cloud", "off")


@dataclass
class TrainConfig:
    """Every knob of a run. Field names are the keys of config files and CLI flags."""

    task: str = "{{ cookiecutter.example_task }}"
    accelerator: str = "auto"
    devices: str = "1"
    strategy: str = "{{ cookiecutter.strategy }}"
    mesh: str = ""
    activation_checkpointing: bool = False
    scan_layers: bool = False
    precision: str = "{{ cookiecutter.precision }}"
    max_epochs: int = 3
    max_steps: int = -1
    batch_size: int = 32  # samples per device of the data axes (data, fsdp, expert)
    # Evaluation's batch_size; 0: the training batch_size (evaluation fits where training
    # does). Never more than the eval split needs: a small split is not padded to it.
    eval_batch_size: int = 0
    eval_batches: int = 0  # batches of each loss evaluation at most (0: the whole eval set)
    optimizer: str = "adamw"
    lr: float = 3e-3
    weight_decay: float = 0.01
    optimizer_options: dict[str, Any] = field(default_factory=dict)
    warmup_steps: int = 20
    schedule: str = "cosine"
    grad_accum: int = 1
    grad_clip: float = 1.0
    # Attention stays inside each document where the data says where documents start
    # (a prepared dataset's `positions`); false: every token reads the whole window
    document_masking: bool = True
    # Trace the step once and replay its graph (false: trace every step, as torch_xla does)
    replay_step: bool = True
    eval_every: int = 0
    log_every: int = 20
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    checkpoint_dir: str = ""  # default: <run_dir>/checkpoints; any fsspec URL (gs://...)
    async_checkpoint: bool = True
    seed: int = 0
    run_dir: str = "runs/default"
    data: str = ""
    num_workers: int = 0
    compile_cache: str = "auto"  # on TPU a shared folder; "off", or a path
    resume: str = ""  # "", "auto", "latest", or a checkpoint (directory) path or URL
    # Goodput records beside the checkpoints: "local", "cloud" (also to Cloud Logging), "off".
    goodput: str = "local"
    # Where the figures go besides the terminal: "tensorboard", "wandb" (the `wandb` extra)
    loggers: list[str] = field(default_factory=lambda: ["tensorboard"])
    # lm-evaluation-harness tasks run beside each loss evaluation (the `eval` extra), from its
    # registry or the folder eval_tasks_path; eval_tasks_limit samples per task (0: all).
    eval_tasks: list[str] = field(default_factory=list)
    eval_tasks_path: str = ""
    eval_tasks_limit: float = 0.0
    eval_tasks_buckets: list[int] = field(default_factory=lambda: [256, 1024])
    eval_tasks_slots: int = 8
    wandb: dict[str, Any] = field(default_factory=dict)  # project, entity, name, tags, group, mode
    profile_steps: int = 0
    profile_port: int = 9012
    metrics_report: bool = False
    task_options: dict[str, Any] = field(default_factory=dict)
    lora: dict[str, Any] = field(default_factory=dict)  # empty: full training (see lora.py)
    moe: dict[str, Any] = field(default_factory=dict)  # mixtures of experts (see hf/moe.py)
    # What the task's model trains for: its own loss ("causal-lm"), "dpo" on the [dpo]
    # table's preference pairs (alignment/dpo.py), or "grpo" on rollouts of the [grpo]
    # table's prompts scored by its reward functions (alignment/grpo.py).
    objective: str = "causal-lm"
    dpo: dict[str, Any] = field(default_factory=dict)
    grpo: dict[str, Any] = field(default_factory=dict)
    # [[pattern, [axis or null per dimension]], ...]: parameter layouts over the mesh
    sharding_rules: list[Any] = field(default_factory=list)

    def changed(self) -> dict[str, Any]:
        """The settings given other values than their defaults (those with a plain default)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.default is not dataclasses.MISSING and getattr(self, f.name) != f.default
        }

    def _check_objective(self) -> None:
        tables = {"dpo": self.dpo, "grpo": self.grpo}
        for name, table in tables.items():
            if table and self.objective != name:
                raise ConfigError(
                    f'a [{name}] table trains by {name.upper()}: set objective = "{name}"'
                )
        if self.objective == "causal-lm":
            return
        if self.objective not in tables:
            raise ConfigError(f"unknown objective {self.objective!r}: use causal-lm, dpo or grpo")
        if importlib.util.find_spec(f"{__package__.split('.')[0]}.alignment") is None:
            raise ConfigError(
                f"objective {self.objective} tunes a pretrained Hugging Face decoder through "
                "its tokenizer: this project's task has neither"
            )
        from ..alignment.dpo import DpoError, DpoSettings
        from ..alignment.grpo import GrpoError, GrpoSettings

        try:
            if self.objective == "dpo":
                DpoSettings.from_dict(self.dpo)
            else:
                GrpoSettings.from_dict(self.grpo)
        except (DpoError, GrpoError) as error:
            raise ConfigError(str(error)) from None

    def _check_eval_tasks(self) -> None:
        if not all(isinstance(name, str) and name for name in self.eval_tasks):
            raise ConfigError(
                f'eval_tasks must be lm-eval task names (["arc_easy"]), got {self.eval_tasks!r}'
            )
        if importlib.util.find_spec(f"{__package__.split('.')[0]}.harness") is None:
            raise ConfigError(
                "eval_tasks are language-model benchmarks: a text task's project runs them"
            )
        if importlib.util.find_spec("lm_eval") is None:
            raise ConfigError(
                "eval_tasks run through lm-evaluation-harness: pip install -e '.[eval]'"
            )
        buckets = self.eval_tasks_buckets
        if not buckets or sorted(set(buckets)) != list(buckets) or buckets[0] < 1:
            raise ConfigError(f"eval_tasks_buckets must be ascending lengths, got {buckets!r}")
        if self.eval_tasks_slots < 1:
            raise ConfigError(f"eval_tasks_slots must be at least 1, got {self.eval_tasks_slots}")

    def validate(self) -> TrainConfig:
        """Raise ConfigError for values no run can use."""
        from ..core import runtime
        from ..core.precision import Precision

        positive = ("batch_size", "grad_accum", "keep_checkpoints")
        for key in positive:
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be at least 1, got {getattr(self, key)}")
        non_negative = (
            "eval_batch_size",
            "eval_batches",
            "eval_tasks_limit",
            "max_epochs",
            "warmup_steps",
            "eval_every",
            "log_every",
            "checkpoint_every",
            "profile_steps",
        )
        for key in non_negative:
            if getattr(self, key) < 0:
                raise ConfigError(f"{key} must not be negative, got {getattr(self, key)}")
        if self.max_steps < -1 or self.max_steps == 0:
            raise ConfigError(
                f"max_steps must be positive (or -1 for no limit), got {self.max_steps}"
            )
        if self.max_steps == -1 and self.max_epochs == 0:
            raise ConfigError("set max_epochs or max_steps: both say the run has no length")
        if self.lr <= 0:
            raise ConfigError(f"lr must be positive, got {self.lr}")
        if self.grad_clip < 0:
            raise ConfigError(
                f"grad_clip must not be negative (0 disables it), got {self.grad_clip}"
            )
        from .optim import OPTIMIZERS, SCHEDULES  # torch, once a config is checked

        if self.schedule not in SCHEDULES:
            raise ConfigError(f"unknown schedule {self.schedule!r}: use {', '.join(SCHEDULES)}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(
                f"unknown optimizer {self.optimizer!r}: use {', '.join(OPTIMIZERS)} "
                "(or give the task a configure_optimizer hook)"
            )
        try:
            Precision.from_name(self.precision)
            runtime.check_settings(self.changed())
        except ValueError as error:
            raise ConfigError(str(error)) from None
        if self.goodput not in GOODPUT_MODES:
            raise ConfigError(f"unknown goodput {self.goodput!r}: use {', '.join(GOODPUT_MODES)}")
        if self.goodput == "cloud" and importlib.util.find_spec("ml_goodput_measurement") is None:
            raise ConfigError(
                'goodput = "cloud" writes through ml-goodput-measurement: '
                "pip install -e '.[goodput]'"
            )
        from .loggers import check as check_loggers

        check_loggers(self.loggers, self.wandb)
        if self.eval_tasks:
            self._check_eval_tasks()
        self._check_objective()
        if self.resume.lower() in ("true", "1", "yes"):
            self.resume = "latest"  # a bare --resume, or resume = true in a file
        if "://" in self.run_dir:
            raise ConfigError(
                f"run_dir {self.run_dir!r} must be a local directory (logs, TensorBoard); "
                "put checkpoints on remote storage with checkpoint_dir"
            )
        local = self.data and not self.data.startswith("hf:") and "://" not in self.data
        if local and not Path(self.data).exists():
            raise ConfigError(f"data path {self.data!r} does not exist")
        if self.lora:
            from ..hf import HFConfigError
            from ..hf.lora import LoraSettings

            try:
                LoraSettings.from_dict(self.lora).check_precision(self.precision)
            except HFConfigError as error:
                raise ConfigError(str(error)) from None
        if self.moe:
            from ..hf import HFConfigError
            from ..hf.moe import MoeSettings

            try:
                MoeSettings.from_dict(self.moe)
            except HFConfigError as error:
                raise ConfigError(str(error)) from None
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def read_file(path: Path) -> dict[str, Any]:
    """Read a TOML or YAML config file into a flat dict."""
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"config file {str(path)!r} must end in .toml, .yaml or .yml")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as error:
        first = str(error).splitlines()[0]
        raise ConfigError(f"cannot parse {str(path)!r}: {first}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a table of keys")
    return data


def _kind(key: str) -> type:
    """The type of a config key's value (from its default)."""
    return type(getattr(TrainConfig(), key))


def _coerce(key: str, value: Any) -> Any:
    kind = _kind(key)
    if kind in (dict, list):
        if isinstance(value, str):
            value = parse_value(value)  # TOML from the command line: {seq_len = 32}, [...]
        if kind is list and isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]  # a,b: words
        if not isinstance(value, kind):
            what = "a table" if kind is dict else "a list"
            raise ConfigError(f"{key} must be {what}, got {value!r}")
        return value
    try:
        if kind is bool:
            return str(value).lower() in ("1", "true", "yes")
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key} must be {kind.__name__}, got {value!r}") from None


def build_config(path: Path | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Defaults < file < overrides; unknown keys are errors, not silently ignored.

    An override's key may reach into a table (`task_options.seq_len`, `lora.rank`); its
    value, when it is text, is read as a TOML value, as it would be in the config file.
    """
    values: dict[str, Any] = {}
    if path is not None:
        values.update(read_file(path))
    for key, value in (overrides or {}).items():
        if value is not None:
            set_value(values, key, value)
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise ConfigError(
            f"unknown config key {unknown[0]!r}: valid keys are {', '.join(sorted(FIELDS))}"
        )
    return TrainConfig(**{k: _coerce(k, v) for k, v in values.items()}).validate()


def set_value(values: dict[str, Any], key: str, value: Any) -> None:
    """Set `key` (dotted into tables: `lora.rank`) in `values`, copying the tables it changes."""
    head, *path = key.split(".")
    if not path:
        values[head] = value
        return
    if head not in FIELDS:
        raise ConfigError(
            f"unknown config key {head!r} in {key!r}: valid keys are {', '.join(sorted(FIELDS))}"
        )
    if _kind(head) is not dict:
        raise ConfigError(f"{head!r} is not a table of options: set it as {head}=VALUE")
    if not all(path):
        raise ConfigError(f"override key {key!r} has an empty part")
    table = values[head] = dict(values.get(head) or {})
    for part in path[:-1]:
        inner = table.get(part)
        table[part] = dict(inner) if isinstance(inner, dict) else {}
        table = table[part]
    table[path[-1]] = parse_value(value) if isinstance(value, str) else value


def parse_value(text: str) -> Any:
    """A command-line value read as TOML (`32`, `1e-3`, `true`, `["q", "v"]`), else the text."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def parse_override(text: str) -> tuple[str, str]:
    """Split a `key=value` override."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {text!r} must look like key=value")
    return key.strip(), value.strip()
