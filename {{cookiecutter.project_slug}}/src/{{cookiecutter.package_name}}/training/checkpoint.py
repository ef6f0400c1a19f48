"""What a run's checkpoint holds, and when it is written or restored.

Everything exact resume needs: weights and optimizer state under the plain model's
parameter names (so a checkpoint reshards into any strategy), the schedule, progress,
the config, and every host's random generators. Storage is core.checkpointing. A checkpoint
names the backend that wrote it: the other backend resumes it too, all but the device's
random generator, which it seeds again from the run's seed and step (and says so).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

from ..core import Strategy, health, ops, runtime
from ..core.checkpoint_files import CheckpointError, find_checkpoint, join
from ..core.checkpointing import CheckpointStore, read, saved_keys
from ..core.layers import stacked_parameters
from ..core.tpu_generations import BACKEND
from ..hf.lora import is_lora
from .state import DEVICE_RNG, Progress, restart_device_rng, restore_rng_states, rng_states

FORMAT = "{{ cookiecutter.package_name }}-checkpoint"
VERSION = 2

__all__ = ["FORMAT", "CheckpointError", "Checkpointer", "read_config", "resume_location"]

# Times a checkpoint `save` or `restore` of a step in a directory (the run's goodput timeline).
Timed = Callable[[str, int, str], AbstractContextManager[None]]


def default_directory(run_dir: str, checkpoint_dir: str) -> str:
    return checkpoint_dir or join(str(run_dir), "checkpoints")


def read_config(location: str) -> tuple[str, dict[str, Any]]:
    """The checkpoint a location names (itself, or the newest in a directory) and its config."""
    path = find_checkpoint(location)
    header: dict[str, Any] = {"format": None, "version": None, "config": None}
    if not set(header) <= saved_keys(path):
        raise CheckpointError(f"{path!r} is not a checkpoint of this project")
    read(path, header)
    if header["format"] != FORMAT:
        raise CheckpointError(f"{path!r} is not a checkpoint of this project")
    if header["version"] != VERSION:
        raise CheckpointError(
            f"{path!r} has checkpoint version {header['version']}, expected {VERSION}"
        )
    return path, dict(header["config"])


def saved_weights(strategy: Strategy | None, model: nn.Module) -> dict[str, Any]:
    """The model's tensors a checkpoint holds, under the plain model's names (live tensors).

    Every tensor of the model; of a LoRA model only the adapters (what trains): its frozen
    base is rebuilt by the task, identically, whenever the checkpoint is read. Without a
    strategy, the model is a plain one on the host.
    """
    state = strategy.model_state_dict(model) if strategy else dict(model.state_dict())
    if not is_lora(model):
        return state
    plain = strategy.plain_name if strategy else str
    trainable = {plain(n) for n, p in model.named_parameters() if p.requires_grad}
    return {name: tensor for name, tensor in state.items() if name in trainable}


def model_state(strategy: Strategy, model: nn.Module) -> dict[str, Any]:
    """The header and the model's saved tensors (the live tensors, not copies)."""
    return {"format": FORMAT, "version": VERSION, "model": saved_weights(strategy, model)}


def load_weights(location: str, strategy: Strategy, model: nn.Module) -> str:
    """Load a checkpoint's weights into a placed model; return the checkpoint's path."""
    path, _ = read_config(location)
    state = {"model": saved_weights(strategy, model)}
    read(path, state)
    strategy.load_model_state_dict(model, state["model"])
    return path


class Checkpointer:
    """Saves and restores a run's full state in `checkpoint_dir` and, for the best eval
    loss, in `<checkpoint_dir>-best`. Never writes non-finite weights."""

    def __init__(
        self,
        directory: str,
        keep: int,
        async_save: bool,
        preemption: bool,
        strategy: Strategy,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        config: dict[str, Any],
        host_read: Callable[[], AbstractContextManager[None]],
        *,
        stream_state: Callable[[Progress], str] | None = None,
        timed: Timed | None = None,
    ) -> None:
        self.steps = CheckpointStore(directory, keep, async_save, preemption)
        self.best = CheckpointStore(directory.rstrip("/") + "-best", 1, async_save)
        self.strategy = strategy
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.config = config
        self.host_read = host_read
        self.stream_state = stream_state  # a resumable stream's state after the trained batches
        self.timed: Timed = timed or (lambda kind, step, directory: nullcontext())
        self.restored_stream = ""  # the state a restored checkpoint held for this host's stream
        self.restored_note = ""  # what a checkpoint of the other backend could not bring
        self.last_good: str | None = None
        self.saved_step: int | None = None  # the step the last regular save wrote
        self.names = {p: strategy.plain_name(n) for n, p in model.named_parameters()}
        self.stacked = stacked_parameters(model)  # scanned blocks: saved per block
        self.weights_finite()  # compiled now: later checks reuse the graph, after warm-up too

    def optimizer_state(self) -> dict[str, dict[str, Any]]:
        """The optimizer's state per plain parameter name (of a stacked one: per block)."""
        entries: dict[str, dict[str, Any]] = {}
        for param, name in self.names.items():
            state = self.optimizer.state.get(param)
            if not state:
                continue
            for index, block_name in self.stacked.get(param, [(None, name)]):
                entries[block_name] = {k: _block(v, index) for k, v in state.items()}
        return entries

    def state(self, progress: Progress) -> dict[str, Any]:
        """The full state, tensors as they live on the devices (sharded or not)."""
        groups = self.optimizer.state_dict()["param_groups"]
        return {
            **model_state(self.strategy, self.model),
            "backend": BACKEND,
            "optimizer": {"state": self.optimizer_state(), "param_groups": groups},
            "scheduler": self.scheduler.state_dict(),
            "progress": progress.to_dict(),
            "config": self.config,
            "rng": {f"host{runtime.process_index()}": rng_states()},
            "data": {f"host{runtime.process_index()}": {"stream": self._stream(progress)}},
        }

    def _stream(self, progress: Progress) -> str:
        return self.stream_state(progress) if self.stream_state is not None else ""

    def weights_finite(self) -> bool:
        with self.host_read():
            return health.all_finite(list(self.model.parameters()))

    def save(self, progress: Progress, best: bool = False) -> str | None:
        """Write a checkpoint unless the weights are not finite (then return None)."""
        if not best and self.saved_step == progress.step:
            return self.last_good  # already written at this step
        store = self.best if best else self.steps
        with self.timed("save", progress.step, store.directory):
            ops.sync()
            if not self.weights_finite():
                return None
            with self.host_read():
                path = store.save(progress.step, self.state(progress))
        if not best:
            self.last_good, self.saved_step = path, progress.step
        return path

    def latest(self) -> str | None:
        steps = self.steps.steps()
        return self.steps.path(steps[-1]) if steps else None

    def restore(self, location: str, progress: Progress) -> Progress:
        """Load a checkpoint into the placed model and primed optimizer; return its progress."""
        path, _ = read_config(location)
        state = self.state(progress)
        host = f"host{runtime.process_index()}"
        if not any(key.startswith(f"rng.{host}.") for key in saved_keys(path)):
            state["rng"] = {}  # saved by fewer hosts: this one keeps its own generators
        if f"data.{host}.stream" not in saved_keys(path):
            state["data"] = {}  # saved before streams were, or by fewer hosts: replayed
        del state["backend"]  # read apart (older checkpoints do not name it)
        written_by = _written_by(path)
        if written_by != BACKEND and state["rng"]:
            del state["rng"][host][DEVICE_RNG]  # the other backend's generator: not ours
        step = posixpath.basename(path.rstrip("/"))
        with self.timed("restore", int(step) if step.isdigit() else 0, path):
            read(path, state)
        self.strategy.load_model_state_dict(self.model, state["model"])
        saved = state["optimizer"]["state"]
        for param, name in self.names.items():
            parts = [saved.get(block) for _, block in self.stacked.get(param, [(None, name)])]
            if all(parts):
                self.optimizer.state[param].update(_restack(parts, param in self.stacked))
        for group, saved in zip(
            self.optimizer.param_groups, state["optimizer"]["param_groups"], strict=True
        ):
            group.update({k: v for k, v in saved.items() if k not in _HOW_IT_COMPUTES})
        self.scheduler.load_state_dict(state["scheduler"])
        self.restored_stream = str(state["data"].get(host, {}).get("stream", ""))
        rng = state["rng"].get(host)
        if rng is not None:
            restore_rng_states(rng, device=written_by == BACKEND)
        progress = Progress.from_dict(state["progress"])
        if written_by != BACKEND:
            seed = int(self.config["seed"])
            restart_device_rng(seed, progress.step)
            self.restored_note = (
                f"checkpoint written by {written_by}: its device RNG state does not carry to "
                f"{BACKEND}; restarted from seed {seed} at step {progress.step}"
            )
        self.last_good = path
        return progress

    def reached_preemption(self, step: int) -> bool:
        return self.steps.reached_preemption(step)

    def finish(self) -> None:
        """Wait for background writes; raise CheckpointError if one failed."""
        with self.timed("save", self.saved_step or 0, self.steps.directory):
            self.steps.finish()
            self.best.finish()


# An optimizer group's entries that say how this backend computes the update (on the device or
# the host), not where the training is: a checkpoint of the other backend keeps its own.
_HOW_IT_COMPUTES = {"params", "capturable", "foreach", "fused", "differentiable"}


def _written_by(path: str) -> str:
    """The backend that wrote a checkpoint (checkpoints that do not say: this one)."""
    if "backend" not in saved_keys(path):
        return BACKEND
    header: dict[str, Any] = {"backend": None}
    read(path, header)
    return str(header["backend"])


def _block(value: Any, index: int | None) -> Any:
    """A stacked state tensor's slice for one block (counters are shared, kept whole)."""
    if index is None or not torch.is_tensor(value) or value.dim() == 0:
        return value
    return value[index]


def _restack(parts: list[Any], stacked: bool) -> dict[str, Any]:
    """Per-block optimizer state put back together for a stacked parameter."""
    if not stacked:
        return dict(parts[0])
    return {
        key: torch.stack([p[key] for p in parts]) if torch.is_tensor(v) and v.dim() else v
        for key, v in parts[0].items()
    }


def resume_location(resume: str, directory: str) -> str | None:
    """What `--resume` names: nothing, the newest checkpoint (`auto`, `latest`), or a path.

    `auto` starts fresh when there is no checkpoint yet; `latest` requires one.
    """
    if not resume:
        return None
    if resume in ("auto", "latest"):
        try:
            return find_checkpoint(directory)
        except CheckpointError:
            if resume == "auto":
                return None
            raise CheckpointError(
                f"--resume latest: no checkpoint in {directory!r}; use --resume auto to "
                "start fresh when there is none"
            ) from None
    return resume
