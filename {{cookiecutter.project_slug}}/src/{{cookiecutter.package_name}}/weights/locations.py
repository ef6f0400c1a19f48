"""Where a pretrained model lives: a local folder, a Hugging Face cache name (resolved offline,
nothing downloaded) or a remote folder (gs://, any fsspec URL); its config and tokenizer from any
of them, a remote folder's small files copied to a temporary folder for transformers to read.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import Any

from .safetensors_io import INDEX, SINGLE
from .storage import Folder, WeightsError

# Files never copied with a remote model's config and tokenizer: its weights.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".gguf", ".ckpt")


def resolve(location: str) -> str:
    """The folder a location names: itself, or a cached model's snapshot (WeightsError if none)."""
    if "://" in location or os.path.isdir(location):
        return location
    from ..hf.models import missing_from_cache

    try:
        from huggingface_hub import snapshot_download

        folder = str(snapshot_download(location, local_files_only=True))
    except (ImportError, OSError, ValueError):
        raise WeightsError(str(missing_from_cache(location, "weights"))) from None
    if not any(os.path.exists(os.path.join(folder, name)) for name in (SINGLE, INDEX)):
        raise WeightsError(str(missing_from_cache(location, "weights")))
    return folder


@contextlib.contextmanager
def small_files(location: str, wanted: tuple[str, ...] = ()) -> Iterator[str]:
    """A remote folder's files other than weights (or only `wanted`) copied to a temporary
    folder, for transformers to read; WeightsError if the folder does not exist."""
    folder = Folder(location)
    try:
        sizes = folder.sizes()
    except FileNotFoundError:
        raise WeightsError(f"{location} does not exist") from None
    names = [n for n in sizes if (n in wanted if wanted else not n.endswith(WEIGHT_SUFFIXES))]
    with tempfile.TemporaryDirectory(prefix="pretrained-") as local:
        contents = folder.fs.cat([folder.join(n) for n in names]) if names else {}
        for name, path in zip(names, [folder.join(n) for n in names], strict=True):
            with open(os.path.join(local, name), "wb") as file:
                file.write(contents[path])
        yield local


def pretrained_config(location: str) -> Any:
    """The transformers config of a location (gs:// too), checked to be a decoder."""
    from ..hf import models

    if "://" not in location:
        return models.pretrained_config(location)
    from transformers import AutoConfig

    with small_files(location, ("config.json",)) as local:
        try:
            config = AutoConfig.from_pretrained(local, local_files_only=True)
        except (OSError, ValueError):
            raise WeightsError(
                f"model_name {location!r} has no config.json: write the model there with "
                "save_pretrained"
            ) from None
    models.check_decoder(config, f"model_name {location!r}")
    config.name_or_path = location  # where it lives, not the temporary copy
    return config


def pretrained_tokenizer(location: str) -> Any:
    """The tokenizer saved with a model (for gs://: its small files copied to a temp folder)."""
    from ..hf import models

    if "://" not in location:
        return models.load_tokenizer(location)
    from transformers import AutoTokenizer

    with small_files(location) as local:
        try:
            tokenizer = AutoTokenizer.from_pretrained(local, local_files_only=True)
        except (OSError, ValueError, TypeError):
            raise WeightsError(
                f"model_name {location!r} has no tokenizer: save it beside the model with "
                "tokenizer.save_pretrained"
            ) from None
    tokenizer.name_or_path = location  # where it lives, not the temporary copy
    return tokenizer
