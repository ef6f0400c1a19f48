"""Attention within documents: segments from positions, the kernel chosen per device, and the
arguments TPU's flash kernel would get (the kernel itself needs a TPU; it is torch_xla's)."""

from __future__ import annotations

{% if cookiecutter.backend == "torch_xla" -%}
import json
import sys
from pathlib import Path
{% endif -%}
from typing import Any

{% if cookiecutter.backend == "torch_xla" -%}
import pytest
{% endif -%}
import torch

{% if cookiecutter.backend == "torch_xla" -%}
from {{ cookiecutter.package_name }}.core import attention
from {{ cookiecutter.package_name }}.core.attention import (
    FLASH,
    SDPA,
    causal_attention,
    document_segments,
    flash_arguments,
    kernel_for,
)
{%- else -%}
from {{ cookiecutter.package_name }}.core.attention import SDPA, document_segments, kernel_for
{%- endif %}


def test_segments_start_wherever_positions_restart() -> None:
    """It numbers documents from positions that restart at 0 or jump (a window's start)."""
    positions = torch.tensor([[3, 4, 5, 0, 1, 0, 0, 1], [0, 1, 2, 3, 4, 5, 6, 7]])
    segments = document_segments(positions)
    assert segments.tolist() == [[0, 0, 0, 1, 1, 2, 3, 3], [0] * 8]
    assert segments.dtype == torch.int32


def test_sdpa_runs_off_a_tpu(device: Any) -> None:
    """It picks SDPA for the device's tensors off a TPU, and for eager CPU tensors."""
    assert kernel_for(torch.zeros(1, device=device)) == SDPA
    assert kernel_for(torch.zeros(1)) == SDPA
{%- if cookiecutter.backend == "torch_xla" %}


# torch_xla only: its Pallas flash kernel (torch_tpu's attention is PyTorch's SDPA).
def flash_contract(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    q_segment_ids: torch.Tensor | None,
    kv_segment_ids: torch.Tensor | None,
    sm_scale: float,
    **layout: Any,
) -> torch.Tensor:
    """What the Pallas kernel computes from its arguments, as its reference does (jax's
    `pallas.ops.tpu.flash_attention.mha_reference`): keys after the query, or of another
    segment, get the kernel's mask value before the softmax."""
    logits = torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float()) * sm_scale
    tokens = q.shape[2]
    mask = torch.ones(tokens, tokens, dtype=torch.bool, device=q.device)
    if causal:
        mask = mask.tril()
    mask = mask[None, None].expand(q.shape[0], 1, tokens, tokens)
    if q_segment_ids is not None and kv_segment_ids is not None:
        mask = mask & (q_segment_ids[:, None, :, None] == kv_segment_ids[:, None, None, :])
    logits = logits.masked_fill(~mask, -0.7 * float(torch.finfo(torch.float32).max))
    return torch.einsum("bhqk,bhkd->bhqd", logits.softmax(-1), v.float())


def test_sdpa_runs_on_xla_cpu_and_flash_is_chosen_on_a_tpu_with_the_kernel(
    device: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It picks SDPA on XLA:CPU and the flash kernel on a TPU where jax is, not for dropout."""
    tensor = torch.zeros(1, device=device)
    assert kernel_for(tensor) == SDPA
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    monkeypatch.setattr(attention, "_flash_installed", lambda: False)
    assert kernel_for(tensor) == SDPA  # no jax: the kernels cannot be built
    monkeypatch.setattr(attention, "_flash_installed", lambda: True)
    assert kernel_for(tensor) == FLASH
    assert kernel_for(tensor, dropout=0.1) == SDPA  # the kernel has no dropout
    assert kernel_for(torch.zeros(1)) == SDPA  # eager CPU tensors


def test_flash_arguments_mean_what_sdpa_computes(device: Any) -> None:
    """It hands the kernel causal attention, one segment id per document and the scale: by
    the kernel's own contract, the output SDPA gives with the block-diagonal mask."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 12, 8).to(device) for _ in range(3))
    positions = torch.tensor(
        [[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4], [5, 6, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1]]
    )
    segments = document_segments(positions).to(device)
    arguments = flash_arguments(q, k, v, segments, 8**-0.5)

    assert arguments["causal"] is True and arguments["sm_scale"] == 8**-0.5
    assert arguments["q_segment_ids"] is segments and arguments["kv_segment_ids"] is segments
    assert arguments["partition_spec"] is None and arguments["mesh"] is None  # one device
    expected = causal_attention(q, k, v, segments).cpu()
    assert torch.allclose(flash_contract(**arguments).cpu(), expected, atol=1e-5)
    # Without the segment ids the contract is plain causal attention: documents leak.
    leaking = {**arguments, "q_segment_ids": None, "kv_segment_ids": None}
    assert not torch.allclose(flash_contract(**leaking).cpu(), expected, atol=1e-3)


def mesh_layouts() -> dict[str, Any]:
    """Flash arguments under meshes of 8 XLA:CPU devices (child process: SPMD starts once)."""
    from {{ cookiecutter.package_name }}.core import runtime
    from {{ cookiecutter.package_name }}.core.strategies import resolve

    runtime.configure("cpu", cpu_devices=8)
    found = {}
    for mesh, strategy, heads in (("context=4,fsdp=2", "fsdp", 8), ("context=4,fsdp=2", "fsdp", 6),
                                  ("data=2,context=2,tensor=2", "spmd", 8)):  # fmt: skip
        chosen = resolve(strategy, "cpu", 8, None, mesh)
        if not found:
            chosen.start()
        chosen._mesh = None
        chosen.mesh()  # the global mesh the kernel reads
        q = torch.zeros(4, heads, 16, 8).to(runtime.device())
        segments = torch.zeros(4, 16, dtype=torch.int32).to(runtime.device())
        arguments = flash_arguments(q, q, q, segments, 1.0)
        names = list(arguments["mesh"].axis_names)
        found[f"{mesh} heads={heads}"] = {"spec": arguments["partition_spec"], "axes": names}
    return found


def test_flash_splits_batch_and_heads_over_the_mesh_and_keeps_tokens_whole(
    python_subprocess: Any,
) -> None:
    """It runs the kernel per device on whole sequences: the batch over the batch axes, the
    heads over context and tensor where they divide them (XLA's all-to-all brings the tokens)."""
    found = python_subprocess([__file__])

    assert found["context=4,fsdp=2 heads=8"] == {
        "spec": ["fsdp", "context", None, None],
        "axes": ["fsdp", "context"],
    }
    assert found["context=4,fsdp=2 heads=6"]["spec"] == ["fsdp", None, None, None]
    assert found["data=2,context=2,tensor=2 heads=8"]["spec"] == [
        "data",
        ["context", "tensor"],
        None,
        None,
    ]


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    print(json.dumps(mesh_layouts()))
{%- endif %}
