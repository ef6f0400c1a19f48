"""The training step traced once and replayed: the compiled graph runs again on new inputs.

torch_xla traces every step anew: each op of the forward, the backward and the optimizer
is recorded on the host before the cached graph runs, so the host's time per step grows
with the model (~20 ms for the 2-block example on a laptop core; a TPU runs such a step in
1-2 ms and would wait). Here the step is traced twice: a capture, then a check that the
second trace is the same graph over the same constants. From the third step on the cached
graph runs directly (`_run_cached_graph`, the mechanism of torch_xla's own dynamo bridge)
on the current state, batch and learning rates; the host's cost is gathering those inputs.

What replay cannot honour, it refuses, and the step is traced every time as before, with
the reason recorded (`reason`):
- a device read inside the step: a branch taken on a device value would be frozen;
- a graph or constant input that differs between the two traces: a host value (a Python
  number that changes) would be frozen at its first value;
- a tensor the step computes but neither updates in place nor returns: it would never
  be updated again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from . import health
from .compiled_step import CompiledStep

# A graph input is a state tensor (by index), an input leaf (by index), the RNG seed,
# or a constant (the device data it had when traced).
Role = tuple[str, Any]


@dataclass
class _Graph:
    hash: Any
    roles: list[Role]
    changed: list[int]  # indexes of the state tensors the step updates
    out_spec: Any
    outputs: int


def _xlac() -> Any:
    import torch_xla

    return torch_xla._XLAC


def _data_id(tensor: torch.Tensor) -> tuple[str, Any]:
    """The identity of a tensor's device buffer, shared by every tensor holding it (a
    tensor still pending has no buffer: its IR's).

    The buffer, not the tensor: a sharded weight no step updates (LoRA's frozen base) is
    read through a new tensor at every access, over the same buffer.
    """
    X = _xlac()
    try:
        return ("buffer", X._get_tensors_handle([tensor])[0])
    except RuntimeError:  # no buffer yet
        return ("ir", str(X._unique_id_for_ir_and_data(tensor)))


def _fresh(tensors: list[torch.Tensor]) -> None:
    """Give each tensor a functional storage of its own data with no history of updates.

    A tensor updated in place before (the optimizer's priming step) keeps those updates in
    its storage, and views of it trace differently (a transpose twice over) than they will
    once replayed results, which have none, take its place: the verifying trace would
    differ from the capture. Nothing is copied.
    """
    X = _xlac()
    for tensor in tensors:
        _, data = X._get_tensors_xla_device_data_node([tensor])
        if len(data) == 1:
            torch._functionalize_unsafe_set(tensor, data[0])


def _pending_python_tensors(besides: list[torch.Tensor]) -> bool:
    """Whether a device tensor Python holds, other than `besides`, has work pending (checked
    after a traced step, before its graph runs: the run gives the old state's buffers to the
    new state, and pending work that reads them could not run after it)."""
    skip = {id(tensor) for tensor in besides}
    tensors = [tensor for tensor in _python_tensors() if id(tensor) not in skip]
    return any(_xlac()._check_tensor_need_materialization(tensors))


def _python_tensors() -> list[torch.Tensor]:
    """The XLA tensors Python holds."""
    import gc
    import warnings

    with warnings.catch_warnings():  # isinstance() on deprecated torch objects warns
        warnings.simplefilter("ignore", FutureWarning)
        return [obj for obj in gc.get_objects() if _on_xla(obj)]


def _on_xla(obj: object) -> bool:
    try:
        return isinstance(obj, torch.Tensor) and obj.device.type == "xla"
    except RuntimeError:  # a tensor subclass without a device of its own: not the step's
        return False


class ReplayedStep(CompiledStep):
    """`step(inputs)`: trace `fn(inputs)` twice, then replay the compiled graph.

    The graph reads the tensors `state()` lists and `inputs`' tensors; `host_read()` wraps
    the one-time comparison of constant inputs. The caller cuts every step with
    `torch_xla.sync()`, which advances the device RNG seed as it does for a traced step.
    `phase` goes from "capture" to "verify" to "replay".
    """

    def _prepare(self) -> None:
        self._graph: _Graph | None = None
        self._constants: list[torch.Tensor] = []

    def __call__(self, inputs: Any) -> Any:
        if self.reason is not None:
            return self.fn(inputs)
        if self.phase == "replay":
            assert self._graph is not None
            return self._replay(self._graph, inputs)
        return self._trace(inputs)

    # ---- the two traced steps --------------------------------------------------------
    def _trace(self, inputs: Any) -> Any:
        import torch_xla
        import torch_xla.core.xla_model as xm

        X = _xlac()
        seed = xm.get_rng_state()  # a sync advances the seed: this one must not
        torch_xla.sync()  # the state is device data: graph inputs, not pending work
        xm.set_rng_state(seed)
        live = self.state()
        if self.phase == "capture":
            self._unshare(live)
            _fresh(live)
        # A graph input is known by the tensor that owns its data, or by the data itself.
        known: dict[Any, Role] = {}
        for kind, tensors in (("input", pytree.tree_leaves(inputs)), ("state", live)):
            for index, tensor in enumerate(tensors):
                known.setdefault(X._xla_get_tensor_id(tensor), (kind, index))
                known.setdefault(_data_id(tensor), (kind, index))
        reads = health.transfer_count()
        out = self.fn(inputs)
        if health.transfer_count() != reads:
            return self._give_up(out, "the step reads the device (a data-dependent branch)")
        out_leaves, out_spec = pytree.tree_flatten(out)
        if not all(isinstance(leaf, torch.Tensor) for leaf in out_leaves):
            return self._give_up(out, "the step returns something other than tensors")
        pending = X._check_tensor_need_materialization(live)
        changed = [index for index, need in enumerate(pending) if need]
        roots = out_leaves + [live[index] for index in changed]
        ids, values = X._get_tensors_xla_device_data_node(roots)
        seed_id = X._get_seed_info_id()
        roles: list[Role] = []
        constants: list[torch.Tensor] = []
        for tensor_id, value in zip(ids, values, strict=True):
            role = known.get(tensor_id) or known.get(_data_id(value))
            if role is None and tensor_id == seed_id:
                role = ("seed", None)
            elif role is None:
                role = ("constant", len(constants))
                constants.append(value)
            roles.append(role)
        if _pending_python_tensors(besides=roots):  # results the graph would not update
            return self._give_up(out, "the step keeps tensors it neither updates nor returns")
        updated = {("state", index) for index in changed}
        # Not a scalar's buffer: torch_xla uploads a number once and hands that buffer to every
        # later upload of it (a checkpoint's step counts), which would read a buffer given away.
        donated = [value for value, role in zip(values, roles, strict=True)
                   if role in updated and value.dim() > 0]  # fmt: skip
        hash_ = self._donating_hash(roots, donated)
        graph = _Graph(hash_, roles, changed, out_spec, len(out_leaves))
        if self.phase == "capture":
            self._compile(roots)
            self._graph, self._constants = graph, constants
        else:
            problem = self._differs(graph, constants)
            if problem:
                return self._give_up(out, problem)
        results = self._run(graph, list(values), live, traced=True)
        del out, out_leaves, roots, values, donated  # the traced tensors: the run did their work
        self.phase = "verify" if self.phase == "capture" else "replay"
        return results

    def _unshare(self, live: list[torch.Tensor]) -> None:
        """Give state tensors that share one device buffer buffers of their own.

        Equal small values loaded from a checkpoint (every parameter's step count) come
        from torch_xla's cache of uploaded scalars as one buffer: one input of the traced
        graph, which a replay would feed to all of them ever after, and a graph unlike the
        uninterrupted run's. Each gets a copy of its value, read once and uploaded uncached.
        """
        X = _xlac()
        seen: set[tuple[str, Any]] = set()
        shared = []
        for tensor in live:
            key = _data_id(tensor)
            if key in seen:
                shared.append(tensor)
            seen.add(key)
        if not shared:
            return
        values = self._read(shared)
        cached = X._get_xla_enable_device_data_cache()
        X._set_xla_enable_device_data_cache(False)
        try:
            for tensor, value in zip(shared, values, strict=True):
                torch._functionalize_unsafe_set(tensor, value.to(tensor.device))
        finally:
            X._set_xla_enable_device_data_cache(cached)

    def _donating_hash(self, roots: list[torch.Tensor], donated: list[torch.Tensor]) -> Any:
        """The hash of the graph whose inputs `donated` (the buffers of the state it updates)
        become its outputs' buffers: the state is held once on the device, not twice."""
        from torch_xla.utils.buffer_donor_context import alias_with_buffer_donor_config

        X = _xlac()
        for tensor in donated:  # the buffers themselves: the state tensors are pending
            X._set_buffer_donation(tensor, True)
        with alias_with_buffer_donor_config(True):  # the donors are part of the hash
            return X._get_graph_hash(roots)

    def _compile(self, roots: list[torch.Tensor]) -> None:
        """Compile the graph into the cache, with the donors `_donating_hash` marked."""
        from torch_xla.utils.buffer_donor_context import alias_with_buffer_donor_config

        with alias_with_buffer_donor_config(True):
            _xlac()._xla_warm_up_cache(roots, [])

    def _differs(self, graph: _Graph, constants: list[torch.Tensor]) -> str | None:
        """Why the second trace is not a replay of the first (None: it is)."""
        first = self._graph
        assert first is not None
        if (graph.hash, graph.roles, graph.changed) != (first.hash, first.roles, first.changed):
            return "the step's graph changes from one step to the next"
        stale = [
            (a, b) for a, b in zip(self._constants, constants, strict=True)
            if _data_id(a) != _data_id(b)
        ]  # fmt: skip
        if stale:  # new data, perhaps the same numbers: read both sides in one transfer
            host = self._read([t for pair in stale for t in pair])
            if not all(torch.equal(a, b) for a, b in zip(host[::2], host[1::2], strict=True)):
                return "the step takes a host value that changes from one step to the next"
        return None

    def _read(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Device values read in one transfer, allowed by the guard and counted."""
        self.reads += 1
        with self.host_read():
            values: list[torch.Tensor] = _xlac()._xla_get_cpu_tensors(tensors)
        return values

    def _give_up(self, out: Any, reason: str) -> Any:
        """Trace every step from now on; this step's traced work is pending, and runs."""
        self.reason = reason
        self._graph, self._constants = None, []
        return out

    # ---- replay ----------------------------------------------------------------------
    def _replay(self, graph: _Graph, inputs: Any) -> Any:
        X = _xlac()
        live = self.state()
        leaves = pytree.tree_leaves(inputs)
        needs = X._check_tensor_need_materialization(leaves)
        pending = [leaf for leaf, need in zip(leaves, needs, strict=True) if need]
        if pending:  # an input computed on the device: the graph takes data
            X._xla_sync_multi(pending, devices=[], wait=False, sync_xla_data=True)
        values = [self._input(role, live, leaves) for role in graph.roles]
        return self._run(graph, values, live)

    def _input(self, role: Role, live: list[torch.Tensor], leaves: list[Any]) -> torch.Tensor:
        kind, ref = role
        if kind == "state":
            return live[ref]
        if kind == "input":
            tensor: torch.Tensor = leaves[ref]
            return tensor
        if kind == "constant":
            return self._constants[ref]
        import torch_xla

        # This step's seed; the caller's sync() advances it, as after a traced step.
        seed: torch.Tensor = _xlac()._get_base_seed_as_tensor(str(torch_xla.device()))
        return seed

    def _run(
        self,
        graph: _Graph,
        values: list[torch.Tensor],
        live: list[torch.Tensor],
        traced: bool = False,
    ) -> Any:
        X = _xlac()
        results = X._run_cached_graph(graph.hash, values)
        for index, result in zip(graph.changed, results[graph.outputs :], strict=True):
            if traced:
                # The result's value and functional storage become the tensor's, and the sync
                # drops the traced update the tensor still records: left pending, it would run
                # at the next sync and read the buffers the run gave away.
                torch._functionalize_unsafe_set(live[index], result)
                torch._sync(live[index])
            else:
                X._replace_xla_tensor(live[index], result)
        return pytree.tree_unflatten(list(results[: graph.outputs]), graph.out_spec)
