"""A model's repeated blocks: found, recomputed in the backward pass, and the ties checked
once a strategy has wrapped or sharded them."""

from __future__ import annotations

from torch import nn

from .. import tying
from ..runtime import RuntimeConfigError

CHECKPOINT_PREFIX = "_checkpoint_wrapped_module."


def blocks_of(model: nn.Module, block_class: type[nn.Module] | None) -> list[nn.Module]:
    """The model's repeated blocks (instances of `block_class`), outermost first."""
    if block_class is None:
        return []
    return [m for m in model.modules() if isinstance(m, block_class) and m is not model]


def checkpoint_blocks(model: nn.Module, block_class: type[nn.Module] | None) -> int:
    """Recompute each block's activations in the backward pass instead of storing them."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )

    blocks = blocks_of(model, block_class)
    if not blocks:
        raise RuntimeConfigError(
            "activation_checkpointing needs the task to name its repeated block "
            "(block_class), or a model built from a BlockStack"
        )
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
