"""A local Google Cloud Storage emulator: tests get a fresh `gs://` bucket served from memory.

`gcs_emulator` (session) runs `gcp-storage-emulator` in a subprocess on a free 127.0.0.1 port;
`gcs_bucket` creates an empty bucket, points gcsfs at the emulator for the test and every
subprocess it starts, and yields `gs://<bucket>`. Without gcsfs or the emulator the tests skip,
unless REQUIRE_GCS_EMULATOR=1 makes that a failure.

The emulator lacks `objects.move`, which gcsfs >= 2026.3 uses for every rename (and
torch.distributed.checkpoint renames its `.metadata` at the end of each save): the 501 answer is
retried for about 30 s before gcsfs copies and deletes instead. Run as a script, this module
starts the emulator with that one call added, done the same way: copy, then delete.

`gcs_emulator.holding(name)` holds the upload of one object: the emulator stops at it (a
client writing it waits, provably mid-write) until the block ends, then drops it unstored,
as the upload of a machine that died is never completed.
"""

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest

REQUIRE_VARIABLE = "REQUIRE_GCS_EMULATOR"
HOLDS_VARIABLE = "GCS_EMULATOR_HOLDS"  # the emulator's folder of held uploads (see `Hold`)
# gcsfs >= 2026.3 asks the bucket's storage layout over gRPC before opening a file. The emulator
# speaks HTTP only, so each ask retries for 60 s and is not cached. gcsfs reads this switch once,
# at import: set it before anything imports gcsfs.
PLAIN_GCSFS_VARIABLE = "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"
os.environ[PLAIN_GCSFS_VARIABLE] = "false"

HOST = "127.0.0.1"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
PROJECT = "test-project"


def require_or_skip(reason: str) -> None:
    """Skip the test for `reason`, or fail it when REQUIRE_GCS_EMULATOR=1."""
    if os.environ.get(REQUIRE_VARIABLE) == "1":
        pytest.fail(f"{reason} ({REQUIRE_VARIABLE}=1)", pytrace=False)
    pytest.skip(reason)


def missing_packages() -> list[str]:
    """The packages the emulator tests need that are not installed."""
    modules = {"gcsfs": "gcsfs", "gcp_storage_emulator": "gcp-storage-emulator"}
    return [name for module, name in modules.items() if importlib.util.find_spec(module) is None]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class Hold:
    """An upload the emulator holds, in its folder of holds: `name` names the object
    (`BUCKET/OBJECT`), `held` appears when its upload arrives, and `release` is a FIFO the
    test keeps open: the emulator reads it to its end, then drops the upload."""

    folder: Path

    def wait(self, process: subprocess.Popen[str]) -> None:
        """Return once the upload is held (the emulator waits: the condition lasts)."""
        deadline = time.monotonic() + 600
        while not (self.folder / "held").exists():
            if process.poll() is not None:
                output = process.communicate()[0] if process.stdout else ""
                pytest.fail(f"exited {process.returncode} before the held upload:\n{output}")
            if time.monotonic() > deadline:
                process.kill()
                pytest.fail("the held upload never came")
            time.sleep(0.01)


@dataclass
class GcsEmulator:
    """A running emulator: its endpoint for STORAGE_EMULATOR_HOST."""

    endpoint: str
    holds: Path

    @contextmanager
    def holding(self, name: str) -> Iterator[Hold]:
        """Hold the upload of `name` (`BUCKET/OBJECT`) until the block ends; then drop it."""
        release = self.holds / "release"
        os.mkfifo(release)
        end = os.open(release, os.O_RDWR)  # the emulator's read waits until it is closed
        (self.holds / "name").write_text(name)
        try:
            yield Hold(self.holds)
        finally:
            (self.holds / "name").unlink()
            release.unlink()
            os.close(end)
            (self.holds / "held").unlink(missing_ok=True)

    def create_bucket(self, name: str) -> str:
        """Create bucket `name` and return its `gs://` URL."""
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project={PROJECT}",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200, f"creating bucket {name}: HTTP {response.status}"
        return f"gs://{name}"


def _start(log: Path, holds: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start the emulator; a port taken between choosing and binding it gets one more try."""
    for _ in range(3):
        port = _free_port()
        endpoint = f"http://{HOST}:{port}"
        command = [sys.executable, __file__, "start", "--host", HOST]
        command += ["--port", str(port), "--in-memory", "--quiet"]
        env = {**os.environ, HOLDS_VARIABLE: str(holds)}
        with log.open("wb") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + START_TIMEOUT
        while process.poll() is None and time.monotonic() < deadline:
            if _answers(f"{endpoint}/"):
                return process, endpoint
            time.sleep(0.05)
        _stop(process)
    pytest.fail(f"the GCS emulator did not answer:\n{log.read_text()[-2000:]}", pytrace=False)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Ask the emulator to stop (it shuts down on Ctrl-C), kill it if it does not."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsEmulator]:
    """One in-memory GCS emulator for the session."""
    missing = missing_packages()
    if missing:
        needed = ", ".join(missing)
        require_or_skip(f"the GCS emulator tests need {needed}: pip install -e '.[dev]'")
    folder = tmp_path_factory.mktemp("gcs-emulator")
    holds = folder / "holds"
    holds.mkdir()
    process, endpoint = _start(folder / "emulator.log", holds)
    try:
        yield GcsEmulator(endpoint, holds)
    finally:
        _stop(process)


@pytest.fixture
def gcs_bucket(gcs_emulator: GcsEmulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An empty bucket on the emulator, as `gs://<bucket>`; gcsfs anonymous, emulator only."""
    import fsspec
    import gcsfs.core

    if fsspec.get_filesystem_class("gs") is not gcsfs.core.GCSFileSystem:
        pytest.fail(
            f"gcsfs was imported before {PLAIN_GCSFS_VARIABLE}=false was set, so every file it "
            "opens waits 60 s on a gRPC probe: import tests/gcs_emulator.py first",
            pytrace=False,
        )
    # For this process: fsspec read its FSSPEC_* variables when it was imported.
    gs_options = {**fsspec.config.conf.get("gs", {}), "token": "anon"}
    monkeypatch.setitem(fsspec.config.conf, "gs", gs_options)
    # For subprocesses: gcsfs finds the emulator, fsspec passes token="anon" to gcsfs.
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)
    monkeypatch.setenv("FSSPEC_GS_TOKEN", "anon")
    monkeypatch.setenv(PLAIN_GCSFS_VARIABLE, "false")
    url = gcs_emulator.create_bucket(f"test-{uuid.uuid4().hex[:12]}")
    try:
        yield url
    finally:
        # Cached filesystems keep listings and sessions of this bucket; drop them with it.
        gcsfs.core.GCSFileSystem.clear_instance_cache()


def _move(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> None:
    """objects.move (`POST .../o/SOURCE/moveTo/o/DESTINATION`): copy, then delete the source."""
    from gcp_storage_emulator.handlers import objects

    params = request.params
    params["dest_bucket_name"] = params["bucket_name"]
    objects.copy(request, response, storage)
    if response.status == HTTPStatus.OK:
        storage.delete_file(params["bucket_name"], params["object_id"])


class DroppedUpload(ConnectionAbortedError):
    """A held upload, dropped: the client that sent it is gone."""


def _hold_uploads(holds: Path) -> None:
    """Every object is stored through Storage.create_file: hold the one `holds/name` names."""
    from gcp_storage_emulator.storage import Storage

    create_file = Storage.create_file

    def create(self: Any, bucket_name: str, file_name: str, *args: Any, **kwargs: Any) -> Any:
        try:
            held = (holds / "name").read_text() == f"{bucket_name}/{file_name}"
        except FileNotFoundError:
            held = False
        if not held:
            return create_file(self, bucket_name, file_name, *args, **kwargs)
        (holds / "held").touch()
        try:
            with (holds / "release").open("rb") as release:
                release.read()  # end-of-file when the test ends the hold
        except FileNotFoundError:
            pass  # ended already
        raise DroppedUpload(f"held upload of {bucket_name}/{file_name} dropped")

    Storage.create_file = create


def serve(argv: list[str]) -> None:
    """Run `gcp-storage-emulator argv...` with objects.move added, and uploads held on ask."""
    from gcp_storage_emulator import server
    from gcp_storage_emulator.__main__ import main

    move = r"^/storage/v1/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)/moveTo/o/"
    move += r"(?P<dest_object_id>.*[^/]+)$"
    server.HANDLERS = ((move, {server.POST: _move}), *server.HANDLERS)
    if os.environ.get(HOLDS_VARIABLE):
        _hold_uploads(Path(os.environ[HOLDS_VARIABLE]))
    main(argv)


if __name__ == "__main__":
    serve(sys.argv[1:])
