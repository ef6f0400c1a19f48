"""A model's repeated blocks recomputed in the backward pass, and the ties checked once a
strategy has wrapped or sharded them."""

from __future__ import annotations

from torch import nn

from .. import tying
from .interface import blocks_to_recompute

CHECKPOINT_PREFIX = "_checkpoint_wrapped_module."


def checkpoint_blocks(model: nn.Module, block_class: type[nn.Module] | None) -> int:
    """Recompute each block's activations in the backward pass instead of storing them."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )

    blocks = blocks_to_recompute(model, block_class)
    wanted = {id(block) for block in blocks}
    apply_activation_checkpointing(model, check_fn=lambda module: id(module) in wanted)
    return len(blocks)


def check_after(model: nn.Module, report: tying.TieReport) -> tying.TieReport:
    """The tie report once the model is wrapped or sharded: its distinct parameters counted
    again (a wrapper that lost a tie would train two copies), with a warning if they differ."""
    import warnings

    after = tying.parameter_count(model)
    if after != report.after:
        warnings.warn(
            f"the model had {report.after} distinct parameters before it was sharded and "
            f"{after} after: some tied weights are no longer shared",
            stacklevel=3,
        )
    return tying.TieReport(report.groups, report.before, after)
