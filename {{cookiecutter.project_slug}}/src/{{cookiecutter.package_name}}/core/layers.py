"""A stack of identical blocks that can run through XLA's scan instead of unrolled.

Unrolled, a 24-block model is 24 copies of the block in the step's graph, and compile
time grows with depth. Scanned, XLA compiles one block and loops it. Scanning also
stores each parameter of the blocks as one tensor of shape [blocks, ...], so the
optimizer updates a dozen tensors instead of hundreds: that per-parameter work would
otherwise keep the graph growing with depth.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


class ScanError(ValueError):
    """A model whose blocks cannot run through scan; the message says why."""


def _flat(name: str) -> str:
    return name.replace(".", "__")


class BlockStack(nn.ModuleList):
    """Identical blocks applied in order: `hidden = block(hidden, *constants)` for each
    block; `constants` are tensors every block reads unchanged (a batch's document segments).

    After `stack_parameters()` (what `scan_layers = true` does) the blocks' parameters
    live stacked in this module and run through `torch_xla.experimental.scan`. Either
    way the state dict holds a ModuleList's names (`blocks.0.attn.qkv.weight`), so
    checkpoints move between scanned and unrolled runs.
    """

    scan = False

    def forward(self, hidden: torch.Tensor, *constants: torch.Tensor) -> torch.Tensor:
        if self.scan:
            return self._scanned(hidden, constants)
        for block in self:
            hidden = block(hidden, *constants)
        return hidden

    # ---- scanned ------------------------------------------------------------------
    def stack_parameters(self, remat: bool = False) -> None:
        """Keep the blocks as one template and stacked tensors; run them through scan.

        `remat` recomputes each block's activations in the backward pass (activation
        checkpointing inside the scan) instead of storing them.
        """
        blocks = list(self)
        _check_scannable(self)
        self.names = [name for name, _ in blocks[0].named_parameters()]
        self.buffer_names = [name for name, _ in blocks[0].named_buffers()]
        self.depth = len(blocks)
        self.remat = remat
        for index in reversed(range(len(blocks))):
            del self[index]
        # The template's own tensors are never read (every call passes the stacked ones):
        # on the meta device it holds no memory. In a list, it is not a submodule.
        self.template = [copy.deepcopy(blocks[0]).to("meta")]
        self.stacked = nn.ParameterDict(
            {
                _flat(name): nn.Parameter(torch.stack([_get(b, name).detach() for b in blocks]))
                for name in self.names
            }
        )
        saved = blocks[0].state_dict()
        for name in self.buffer_names:
            self.register_buffer(
                f"stacked_{_flat(name)}",
                torch.stack([_get(b, name) for b in blocks]),
                persistent=name in saved,
            )
        self._register_state_dict_hook(_unstack_state)
        self._register_load_state_dict_pre_hook(_stack_state)
        self.scan = True

    def _scanned(self, hidden: torch.Tensor, constants: tuple[torch.Tensor, ...]) -> torch.Tensor:
        from functorch.compile import default_partition, min_cut_rematerialization_partition
        from torch_xla.experimental.scan import scan

        template = self.template[0]
        params = {name: self.stacked[_flat(name)] for name in self.names}
        buffers = {name: getattr(self, f"stacked_{_flat(name)}") for name in self.buffer_names}

        if not hasattr(self, "_one_block"):  # the same function every step: traced once
            # The constants ride in the carry, returned unchanged: a tensor the function
            # closed over would be frozen into the graph at its first value.
            def one_block(carry: Any, weights: Any) -> tuple[Any, None]:
                merged = {**weights[0], **weights[1]}
                hidden = torch.func.functional_call(template, merged, carry, strict=True)
                return (hidden, *carry[1:]), None

            self._one_block = one_block
        partition = min_cut_rematerialization_partition if self.remat else default_partition
        carry, _ = scan(
            self._one_block,
            (hidden, *constants),
            (params, buffers),
            partition_fn=partition,
            is_fn_pure=True,
        )
        return carry[0]  # type: ignore[no-any-return]

    def per_block(self, name: str) -> Iterator[tuple[int, str]]:
        """For a stacked parameter's name, each block's index and plain parameter name."""
        for index in range(self.depth):
            yield index, f"{index}.{name}"


def _get(module: nn.Module, dotted: str) -> torch.Tensor:
    owner, _, leaf = dotted.rpartition(".")
    holder = module.get_submodule(owner) if owner else module
    tensor = getattr(holder, leaf)
    assert isinstance(tensor, torch.Tensor)
    return tensor


def _check_scannable(stack: BlockStack) -> None:
    """Refuse blocks that scan cannot carry: dropout, batch statistics, shared weights."""
    found = []
    for module in stack.modules():
        rate = module.p if isinstance(module, nn.Dropout) else getattr(module, "dropout", 0.0)
        if isinstance(rate, float) and rate > 0:
            found.append(f"{type(module).__name__} (dropout {rate})")
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            found.append(type(module).__name__)
    if found:
        raise ScanError(
            "scan_layers runs blocks without dropout or batch statistics (torch_xla's scan "
            f"cannot carry their randomness or state): found {', '.join(found)}; set dropout "
            "to 0, or scan_layers to false"
        )
    names = [n for n, _ in stack.named_parameters(remove_duplicate=False)]
    if len(names) != len(list(stack.parameters())):
        raise ScanError("scan_layers needs blocks that share no weights with each other")


def _unstack_state(module: nn.Module, state: dict[str, Any], prefix: str, _: Any) -> None:
    """state_dict hook: the stacked tensors as each block's own entries (views)."""
    assert isinstance(module, BlockStack)
    persistent = [n for n in module.buffer_names if f"{prefix}stacked_{_flat(n)}" in state]
    for name in module.names:
        stacked = state.pop(f"{prefix}stacked.{_flat(name)}")
        for index, key in module.per_block(name):
            state[prefix + key] = stacked[index]
    for name in persistent:
        stacked = state.pop(f"{prefix}stacked_{_flat(name)}")
        for index, key in module.per_block(name):
            state[prefix + key] = stacked[index]


def _stack_state(
    module: nn.Module, state: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
) -> None:
    """load_state_dict pre-hook: each block's entries stacked into the stored tensors."""
    assert isinstance(module, BlockStack)
    for name in [*module.names, *module.buffer_names]:
        keys = [prefix + key for _, key in module.per_block(name)]
        if all(key in state for key in keys):
            target = "stacked." if name in module.names else "stacked_"
            state[f"{prefix}{target}{_flat(name)}"] = torch.stack([state.pop(k) for k in keys])


def stacks(model: nn.Module) -> list[BlockStack]:
    return [module for module in model.modules() if isinstance(module, BlockStack)]


def enable_scan(model: nn.Module, remat: bool = False) -> int:
    """Run every BlockStack of the model through scan; return how many blocks that covers."""
    found = [stack for stack in stacks(model) if len(stack) > 1]
    if not found:
        raise ScanError(
            "scan_layers needs a model whose repeated blocks sit in a BlockStack "
            "(core.layers): this task's model has none with more than one block"
        )
    depth = 0
    for stack in found:
        depth += len(stack)
        stack.stack_parameters(remat)
    return depth


def stacked_parameters(model: nn.Module) -> dict[nn.Parameter, list[tuple[int, str]]]:
    """Each stacked parameter, and for each block its index and the plain model's name."""
    found: dict[nn.Parameter, list[tuple[int, str]]] = {}
    for prefix, module in model.named_modules():
        if isinstance(module, BlockStack) and module.scan:
            base = f"{prefix}." if prefix else ""
            for name in module.names:
                found[module.stacked[_flat(name)]] = [
                    (index, base + key) for index, key in module.per_block(name)
                ]
    return found


def block_class_of(model: nn.Module) -> type[nn.Module] | None:
    """The class of the blocks in the model's first BlockStack, if it has one."""
    for stack in stacks(model):
        if stack.scan:
            return type(stack.template[0])
        if len(stack):
            return type(stack[0])
    return None
