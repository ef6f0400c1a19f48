"""Building a model without memory: its parameters on the meta device (shapes and dtypes,
no storage), its buffers real (small: masks, rotary tables, computed as the model is built).

The model's own constructor runs unchanged; every parameter it registers is moved to the
meta device as it is registered (what `accelerate.init_empty_weights(include_buffers=False)`
does), so a constructor that allocates a parameter with `torch.empty` leaves no memory
behind, and its initialization of meta tensors does nothing. A constructor that computes
on its parameters (a buffer derived from a weight) cannot be built so: `blocker` says why.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from torch import nn

_state = threading.local()


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Within the block, every parameter a module registers lands on the meta device."""
    register = nn.Module.register_parameter

    def to_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is None or param.is_meta:
            return
        registered = module._parameters[name]
        assert registered is not None
        moved = type(registered)(registered.to("meta"), requires_grad=registered.requires_grad)
        moved.__dict__.update(registered.__dict__)  # attributes libraries set on it
        module._parameters[name] = moved

    nn.Module.register_parameter = to_meta  # type: ignore[method-assign,assignment]
    _state.active = True
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]
        _state.active = False


def building_on_meta() -> bool:
    """True inside `parameters_on_meta` (a task builds its model from its config there, not
    from pretrained weights, which are read by shard later)."""
    return bool(getattr(_state, "active", False))


def blocker(model: nn.Module) -> str | None:
    """Why a model built on the meta device cannot be used (None: it can)."""
    for name, buffer in model.named_buffers():
        if buffer.is_meta:
            return f"its buffer {name!r} is computed from a parameter while it is built"
    return None
