"""The local GCS emulator: `gs://` URLs work through fsspec and gcsfs, fast and offline."""

import os
import time
import urllib.request
import warnings
from collections.abc import Callable
from typing import Any

import fsspec
import pytest

from gcs_emulator import PLAIN_GCSFS_VARIABLE, REQUIRE_VARIABLE, require_or_skip


def _timed(timings: dict[str, float], name: str, call: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    result = call()
    timings[name] = time.perf_counter() - start
    return result


def test_gcs_round_trip(gcs_bucket: str) -> None:
    """It writes, reads, lists and deletes objects on gs:// through fsspec and gcsfs."""
    fs, root = fsspec.core.url_to_fs(f"{gcs_bucket}/run/step-5")
    timings: dict[str, float] = {}

    def write() -> None:
        with fsspec.open(f"{gcs_bucket}/run/step-5/shard-0", "wb") as stream:
            stream.write(b"weights")

    _timed(timings, "write", write)
    _timed(timings, "pipe", lambda: fs.pipe(f"{root}/shard-1", b"optimizer"))
    data = _timed(timings, "read", lambda: fs.cat(f"{root}/shard-0"))
    listing = _timed(timings, "list", lambda: fs.ls(root, detail=False))
    _timed(timings, "delete", lambda: fs.rm(root, recursive=True))
    fs.invalidate_cache()
    print("gcs emulator call times:", {name: f"{s * 1000:.1f} ms" for name, s in timings.items()})

    assert data == b"weights"
    assert sorted(listing) == [f"{root}/shard-0", f"{root}/shard-1"]
    assert not fs.exists(f"{root}/shard-0")


def test_gcs_emulator_moves_objects(gcs_bucket: str) -> None:
    """It answers gcsfs's moveTo call itself, so a rename does not wait out 30 s of retries."""
    fs, bucket = fsspec.core.url_to_fs(gcs_bucket)
    fs.pipe(f"{bucket}/.metadata.tmp", b"plan")
    endpoint = os.environ["STORAGE_EMULATOR_HOST"]
    request = urllib.request.Request(
        f"{endpoint}/storage/v1/b/{bucket}/o/.metadata.tmp/moveTo/o/.metadata", method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
    fs.invalidate_cache()
    assert fs.cat(f"{bucket}/.metadata") == b"plan"
    assert not fs.exists(f"{bucket}/.metadata.tmp")

    timings: dict[str, float] = {}
    _timed(timings, "mv", lambda: fs.mv(f"{bucket}/.metadata", f"{bucket}/moved"))
    print(f"gcsfs mv on the emulator: {timings['mv'] * 1000:.1f} ms")
    assert fs.cat(f"{bucket}/moved") == b"plan"


def test_gcs_checkpoint_round_trip(gcs_bucket: str) -> None:
    """It saves and loads a torch.distributed.checkpoint under a gs:// URL."""
    import torch
    import torch.distributed.checkpoint as dcp

    url = f"{gcs_bucket}/run/step-5"
    state = {"weight": torch.arange(12.0).reshape(3, 4), "bias": torch.ones(4)}
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.save(state, checkpoint_id=url)
        saved = time.perf_counter()
        loaded = {"weight": torch.zeros(3, 4), "bias": torch.zeros(4)}
        dcp.load(loaded, checkpoint_id=url)
    print(f"dcp save {saved - start:.2f} s, load {time.perf_counter() - saved:.2f} s on gs://")
    assert torch.equal(loaded["weight"], state["weight"])
    assert torch.equal(loaded["bias"], state["bias"])


def test_gcs_filesystem_skips_bucket_type_probe(
    gcs_bucket: str, python_subprocess: Callable[..., dict[str, Any]]
) -> None:
    """It uses gcsfs's plain HTTP filesystem, anonymously, here and in subprocesses."""
    import gcsfs.core

    fs, _ = fsspec.core.url_to_fs(gcs_bucket)
    assert type(fs) is gcsfs.core.GCSFileSystem
    assert fs.credentials.method == "anon"
    assert fs._location == os.environ["STORAGE_EMULATOR_HOST"]

    code = (
        "import json, fsspec, gcsfs.core\n"
        f"fs, _ = fsspec.core.url_to_fs({gcs_bucket!r})\n"
        f"fs.pipe({gcs_bucket!r} + '/from-child', b'hello')\n"
        "print(json.dumps({'plain': type(fs) is gcsfs.core.GCSFileSystem,\n"
        "    'method': fs.credentials.method, 'location': fs._location}))\n"
    )
    child = python_subprocess(["-c", code])
    assert child["plain"], f"{PLAIN_GCSFS_VARIABLE} did not reach the subprocess"
    assert child["method"] == "anon"
    assert child["location"] == os.environ["STORAGE_EMULATOR_HOST"]
    assert fs.cat(f"{gcs_bucket}/from-child") == b"hello"


def test_missing_emulator_skips_unless_required(monkeypatch: pytest.MonkeyPatch) -> None:
    """It skips without the emulator, and fails instead when REQUIRE_GCS_EMULATOR=1."""
    monkeypatch.delenv(REQUIRE_VARIABLE, raising=False)
    with pytest.raises(pytest.skip.Exception, match="needs gcsfs"):
        require_or_skip("needs gcsfs")
    monkeypatch.setenv(REQUIRE_VARIABLE, "1")
    with pytest.raises(pytest.fail.Exception, match="needs gcsfs"):
        require_or_skip("needs gcsfs")
