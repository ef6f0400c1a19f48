"""One optimizer step: each micro-batch's forward and backward, then the update, as one
graph that is traced once and then replayed (`core/replay.py`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from ..core import Precision, ReplayedStep, Strategy, ops
from ..hf.moe import experts_modules
from ..tasks import Task, train_metrics, without_documents
from .config import TrainConfig

Batch = Any


class TrainStep:
    """`step(micro_batches)` -> the step's mean loss (a device scalar, read at logging);
    `metrics` holds the step's other numbers (a mixture of experts' router numbers), means
    over the micro-batches, device scalars too.

    The learning rates are inputs of the graph, uploaded at every step from the host's
    schedule, so a replayed step follows the schedule; an optimizer that cannot take its
    learning rate as a device tensor is traced every step instead, as one that reads the
    device or changes its graph is (`reason` says why).
    """

    def __init__(
        self,
        task: Task,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        strategy: Strategy,
        precision: Precision,
        config: TrainConfig,
        host_read: Callable[[], contextlib.AbstractContextManager[Any]],
    ) -> None:
        self.task, self.model, self.optimizer = task, model, optimizer
        self.scheduler, self.strategy = scheduler, strategy
        self.precision, self.config = precision, config
        self.metrics: dict[str, torch.Tensor] = {}
        self.parameters = list(model.parameters())  # a list: dynamo iterates no generator
        # What train_metrics looks for in the model (a mixture's experts) is found here, not
        # in the compiled step: dynamo tracing the search reads sys.modules, which another
        # thread's import can change under it ("dictionary changed size during iteration").
        experts_modules(model)
        reason = None if config.replay_step else "replay_step = false"
        self.replayed = ReplayedStep(
            self._step, self._state, host_read, reason or ops.host_learning_rate(optimizer)
        )

    @property
    def reason(self) -> str | None:
        """Why every step is traced (None: the step is replayed)."""
        return self.replayed.reason

    def __call__(self, batches: Sequence[Batch]) -> torch.Tensor:
        rates = None
        if self.replayed.reason is None:
            rates = ops.to_device([float(group["lr"]) for group in self.optimizer.param_groups])
        loss, self.metrics = self.replayed((list(batches), rates))
        self.scheduler.step()  # the host's schedule: the next step's rates
        return loss

    def _step(
        self, inputs: tuple[list[Batch], torch.Tensor | None]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        batches, rates = inputs
        accum = len(batches)
        losses, numbers = [], []
        for batch in batches:
            if not self.config.document_masking:
                batch = without_documents(batch)
            batch = self.precision.convert_batch(batch)
            with self.precision.forward_context():
                loss = self.task.loss(self.model, batch)
            numbers.append(train_metrics(self.task, self.model))
            ops.backward(loss / accum if accum > 1 else loss)  # `/ 1` would be a graph node
            losses.append(loss.detach().float())
        self.strategy.reduce_gradients(self.optimizer)
        if self.config.grad_clip:  # after the cross-replica reduction
            ops.clip_grad_norm_(self.parameters, self.config.grad_clip)
        with device_rates(self.optimizer, rates):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if accum == 1:
            return losses[0], numbers[0]
        means = {key: torch.stack([n[key] for n in numbers]).mean() for key in numbers[0]}
        return torch.stack(losses).mean(), means

    def _state(self) -> list[torch.Tensor]:
        """Every device tensor a step reads or updates: weights, buffers, optimizer state.

        In an order fixed by the model and the param groups, never by how the optimizer's
        state was filled (primed, or loaded from a checkpoint): the order makes the graph,
        and a resumed run must compile the graph the uninterrupted one ran.
        """
        found: dict[int, torch.Tensor] = {}
        for tensor in [*self.model.parameters(), *self.model.buffers()]:
            found.setdefault(id(tensor), tensor)
        for group in self.optimizer.param_groups:
            for param in group["params"]:
                state = self.optimizer.state.get(param, {})
                for key in sorted(state):
                    if torch.is_tensor(state[key]):
                        found.setdefault(id(state[key]), state[key])
        return [tensor for tensor in found.values() if ops.traced_lazily(tensor)]


@contextlib.contextmanager
def device_rates(optimizer: torch.optim.Optimizer, rates: torch.Tensor | None) -> Iterator[None]:
    """The param groups' learning rates as device scalars for one update, then as before."""
    if rates is None:
        yield
        return
    saved = [group["lr"] for group in optimizer.param_groups]
    for index, group in enumerate(optimizer.param_groups):
        group["lr"] = rates[index]
    try:
        yield
    finally:
        for group, rate in zip(optimizer.param_groups, saved, strict=True):
            group["lr"] = rate
