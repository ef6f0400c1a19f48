"""Decoder shapes `plan --architecture` builds without any config file: sizes known by name
(Llama 3's 8B and 70B, Llama 3.1's 405B, Mixtral's 8x7B, Llama 4 Scout's text model), or
written out (`--size dim=4096,layers=32,...`), or both (`--size 8b,layers=16`: the 8B shape
with 16 layers).

The shapes are the published configs' (meta-llama/Meta-Llama-3-8B and -70B,
meta-llama/Llama-3.1-405B, mistralai/Mixtral-8x7B-v0.1, meta-llama/Llama-4-Scout-17B-16E's
`text_config`, `config.json`): only what sizes parameters and activations matters here, not
rotary or norm settings. Scout's layers are all mixtures, so its dense layers' MLP size
(`intermediate_size_mlp`) sizes nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..hf.models import Sizes

LLAMA3_VOCAB, LLAMA3_POSITIONS, LLAMA31_POSITIONS = 128256, 8192, 131072
MIXTRAL_VOCAB, MIXTRAL_POSITIONS = 32000, 32768
LLAMA4_VOCAB, SCOUT_POSITIONS = 202048, 10485760
PRESETS: dict[str, dict[str, Sizes]] = {
    "llama": {
        "8b": Sizes(vocab=LLAMA3_VOCAB, positions=LLAMA3_POSITIONS, dim=4096, layers=32,
                    heads=32, kv_heads=8, mlp_dim=14336, tie_embeddings=False),
        "70b": Sizes(vocab=LLAMA3_VOCAB, positions=LLAMA3_POSITIONS, dim=8192, layers=80,
                     heads=64, kv_heads=8, mlp_dim=28672, tie_embeddings=False),
        "405b": Sizes(vocab=LLAMA3_VOCAB, positions=LLAMA31_POSITIONS, dim=16384, layers=126,
                      heads=128, kv_heads=8, mlp_dim=53248, tie_embeddings=False),
    },
    "mixtral": {
        "8x7b": Sizes(vocab=MIXTRAL_VOCAB, positions=MIXTRAL_POSITIONS, dim=4096, layers=32,
                      heads=32, kv_heads=8, mlp_dim=14336, tie_embeddings=False, experts=8,
                      experts_per_token=2),
    },
    "llama4_text": {
        "scout": Sizes(vocab=LLAMA4_VOCAB, positions=SCOUT_POSITIONS, dim=5120, layers=48,
                       heads=40, kv_heads=8, mlp_dim=8192, tie_embeddings=False, experts=16,
                       experts_per_token=1),
    },
}  # fmt: skip
FIELDS = ("vocab", "positions", "dim", "layers", "heads", "kv_heads", "mlp_dim", "experts",
          "experts_per_token")  # fmt: skip
REQUIRED = ("vocab", "dim", "layers", "heads")


class SizeError(ValueError):
    """A `--size` that names no known shape or leaves one out."""


def parse_size(architecture: str, text: str, seq_len: int) -> Sizes:
    """The decoder shape `text` describes for `architecture` (positions: `seq_len` unless set)."""
    known = PRESETS.get(architecture, {})
    base: Sizes | None = None
    values: dict[str, Any] = {}  # field -> a positive int
    for item in filter(None, (part.strip() for part in text.split(","))):
        field, sep, number = item.partition("=")
        if not sep:
            if base is not None:
                raise SizeError(f"--size {text!r} names two shapes: give one, then FIELD=N pairs")
            if field.lower() not in known:
                raise SizeError(_unknown_preset(architecture, field, known))
            base = known[field.lower()]
            continue
        if field not in FIELDS:
            raise SizeError(
                f"--size field {field!r} is unknown: the fields are {', '.join(FIELDS)}"
            )
        if not number.strip().isdigit() or int(number) < 1:
            raise SizeError(f"--size {field}={number!r}: give a positive whole number")
        values[field] = int(number)
    if base is not None:
        return dataclasses.replace(base, **values)
    missing = [field for field in REQUIRED if field not in values]
    if missing:
        raise SizeError(
            f"--size leaves out {', '.join(missing)}: give {', '.join(f'{f}=N' for f in REQUIRED)}"
            f" (or a known size{_known_text(architecture, known)})"
        )
    return Sizes(
        vocab=values["vocab"],
        positions=values.get("positions", seq_len),
        dim=values["dim"],
        layers=values["layers"],
        heads=values["heads"],
        kv_heads=values.get("kv_heads", 0),
        mlp_dim=values.get("mlp_dim", 0),
        experts=values.get("experts", 0),
        experts_per_token=values.get("experts_per_token", 0),
    )


def _unknown_preset(architecture: str, name: str, known: dict[str, Sizes]) -> str:
    if not known:
        return (
            f"--size {name!r}: no {architecture} size is known by name; write its shape out "
            "(--size vocab=N,dim=N,layers=N,heads=N)"
        )
    return f"--size {name!r} is not a known {architecture} size{_known_text(architecture, known)}"


def _known_text(architecture: str, known: dict[str, Sizes]) -> str:
    return f": {architecture} sizes are {', '.join(known)}" if known else ""
