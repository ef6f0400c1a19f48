"""A stack of identical blocks that can run through XLA's scan instead of unrolled."""

from __future__ import annotations

import torch
from torch import nn


class BlockStack(nn.ModuleList):
    """Identical blocks applied in order: `hidden = block(hidden)` for each block.

    With `scan` on (the `scan_layers` config key) the blocks run through
    `torch_xla.experimental.scan_layers`: XLA compiles one block and loops it, so
    compile time stops growing with depth. Parameter names are those of a ModuleList
    (`blocks.0.attn.qkv.weight`), scanned or not, so checkpoints move between the two.
    """

    scan = False

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.scan and len(self) > 1:
            from torch_xla.experimental.scan_layers import scan_layers

            out: torch.Tensor = scan_layers(self, hidden)
            return out
        for block in self:
            hidden = block(hidden)
        return hidden


def stacks(model: nn.Module) -> list[BlockStack]:
    return [module for module in model.modules() if isinstance(module, BlockStack)]


def enable_scan(model: nn.Module) -> int:
    """Run every BlockStack of the model through scan; return how many blocks that covers."""
    found = stacks(model)
    for stack in found:
        stack.scan = True
    return sum(len(stack) for stack in found)


def block_class_of(model: nn.Module) -> type[nn.Module] | None:
    """The class of the blocks in the model's first BlockStack, if it has one."""
    for stack in stacks(model):
        if len(stack):
            return type(stack[0])
    return None
