"""A local Google Cloud Storage emulator: tests get a fresh `gs://` bucket served from memory.

`gcs_emulator` (session) runs `gcp-storage-emulator` in a subprocess on a free 127.0.0.1 port;
`gcs_bucket` creates an empty bucket, points gcsfs at the emulator for the test and every
subprocess it starts, and yields `gs://<bucket>`. `gated_gcs_bucket` does the same on an
emulator of its own that can hold the upload or the download of an object until the test lets
it through or drops it (`ObjectGate`): a test knows then, for certain, where a process that
writes or reads there is, and that it is gone once its connection closes (`abandoned`).
Without gcsfs or the emulator the tests skip, unless REQUIRE_GCS_EMULATOR=1 makes that a failure.

The emulator serves one request at a time from a listen backlog of 5: a client sending more at
once (gcsfs reading many byte ranges or objects concurrently) sees the rest dropped and retried
a second later. Run as a script, this module gives it a backlog of real size.

The emulator lacks `objects.move`, which gcsfs >= 2026.3 uses for every rename (and
torch.distributed.checkpoint renames its `.metadata` at the end of each save): the 501 answer is
retried for about 30 s before gcsfs copies and deletes instead. Run as a script, this module
also adds that one call, done the same way: copy, then delete; and the cancelling of a
resumable upload (a DELETE of its session), which an abandoned upload sends.
"""

import contextlib
import importlib.util
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import unquote

import pytest

REQUIRE_VARIABLE = "REQUIRE_GCS_EMULATOR"
GATE_VARIABLE = "GCS_EMULATOR_GATE"  # a folder: the emulator holds uploads it names there
GATE_TIMEOUT = 300.0
# gcsfs >= 2026.3 asks the bucket's storage layout over gRPC before opening a file. The emulator
# speaks HTTP only, so each ask retries for 60 s and is not cached. gcsfs reads this switch once,
# at import: set it before anything imports gcsfs.
PLAIN_GCSFS_VARIABLE = "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"
os.environ[PLAIN_GCSFS_VARIABLE] = "false"

HOST = "127.0.0.1"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
PROJECT = "test-project"
BACKLOG = 512  # connections waiting for the one-at-a-time emulator, as GCS takes them at once


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
class GcsEmulator:
    """A running emulator: its endpoint for STORAGE_EMULATOR_HOST."""

    endpoint: str

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


def _start(log: Path, gate: Path | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """Start the emulator; a port taken between choosing and binding it gets one more try."""
    env = {**os.environ, **({GATE_VARIABLE: str(gate)} if gate else {})}
    for _ in range(3):
        port = _free_port()
        endpoint = f"http://{HOST}:{port}"
        command = [sys.executable, __file__, "start", "--host", HOST]
        command += ["--port", str(port), "--in-memory", "--quiet"]
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
    process, endpoint = _start(tmp_path_factory.mktemp("gcs-emulator") / "emulator.log")
    try:
        yield GcsEmulator(endpoint)
    finally:
        _stop(process)


@pytest.fixture
def gcs_bucket(gcs_emulator: GcsEmulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An empty bucket on the emulator, as `gs://<bucket>`; gcsfs anonymous, emulator only."""
    yield from _bucket(gcs_emulator, monkeypatch)


@dataclass
class ObjectGate:
    """Holds the uploads and downloads of objects whose name contains a pattern, until
    `release()`."""

    folder: Path

    def hold(self, pattern: str) -> None:
        for name in ("held", "gone", "client"):
            (self.folder / name).unlink(missing_ok=True)
        (self.folder / "hold").write_text(pattern)

    def held(self, process: subprocess.Popen[str] | None = None) -> str:
        """Wait until a transfer is held (failing if `process`, the client, exits first);
        the object's name."""
        deadline = time.monotonic() + GATE_TIMEOUT
        while not (self.folder / "held").exists():
            if process is not None and process.poll() is not None:
                output = process.communicate()[0] if process.stdout else ""
                pytest.fail(f"exited {process.returncode} before the gate:\n{output[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"no object matched the gate in {GATE_TIMEOUT:.0f} s", pytrace=False)
            time.sleep(0.02)
        return (self.folder / "held").read_text()

    def client(self, pids: list[int]) -> int:
        """Which of `pids` made the held transfer: the one holding its connection's socket
        (Linux /proc)."""
        port, server = (self.folder / "client").read_text().split()
        inodes = _connection_inodes(int(port), int(server))
        for pid in pids:
            for descriptor in Path(f"/proc/{pid}/fd").glob("*"):
                with contextlib.suppress(OSError):  # closed meanwhile
                    if os.readlink(descriptor) in inodes:
                        return pid
        pytest.fail(f"none of {pids} holds the held transfer's connection", pytrace=False)

    def abandoned(self) -> None:
        """Wait until the client of the held transfer has closed its connection, as the
        kernel does for a process that died: it got nothing of the transfer."""
        deadline = time.monotonic() + GATE_TIMEOUT
        while not (self.folder / "gone").exists():
            if time.monotonic() > deadline:
                pytest.fail(f"the held transfer's client stayed {GATE_TIMEOUT:.0f} s")
            time.sleep(0.02)

    def release(self, drop: bool = False) -> None:
        """Let the held upload through; with `drop`, refuse it instead, as the upload of a
        machine that died is never completed."""
        if drop:
            (self.folder / "drop").touch()
        (self.folder / "hold").unlink(missing_ok=True)


@pytest.fixture
def gated_gcs_bucket(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, ObjectGate]]:
    """An empty bucket on an emulator of its own, and the ObjectGate that holds its objects."""
    missing = missing_packages()
    if missing:
        require_or_skip(
            f"the GCS emulator tests need {', '.join(missing)}: pip install -e '.[dev]'"
        )
    folder = tmp_path_factory.mktemp("gcs-gate")
    process, endpoint = _start(folder / "emulator.log", gate=folder)
    gate = ObjectGate(folder)
    try:
        for url in _bucket(GcsEmulator(endpoint), monkeypatch):
            yield url, gate
    finally:
        gate.release()
        _stop(process)


def _bucket(gcs_emulator: GcsEmulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
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


def _connection_inodes(port: int, server: int) -> set[str]:
    """The sockets (as /proc/PID/fd links name them) of TCP connections from local `port` to
    `server`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, remote = (int(end.rsplit(":", 1)[1], 16) for end in fields[1:3])
                if (local, remote) == (port, server):
                    found.add(f"socket:[{fields[9]}]")
    return found


def _cancel_upload(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> None:
    """A resumable upload's session deleted (a client abandoning it): dropped, with the 499
    GCS answers (the emulator lacks the call: its 501 is retried for a minute)."""
    with contextlib.suppress(Exception):  # unknown or already gone: nothing to drop
        storage.delete_resumable_file_obj(request.query["upload_id"][0])
    response.status = SimpleNamespace(value=499, phrase="Client Closed Request")


def _upload_name(request: Any) -> str:
    """The object an upload names: in its query, or in its metadata (multipart, resumable)."""
    if "name" in request.query:
        return str(request.query["name"][0])
    data = request.data if isinstance(request.data, dict) else {}
    return str((data.get("meta") or data).get("name", ""))


def _object_name(request: Any) -> str:
    """The object a download names, in its path."""
    return unquote(str(request.params.get("object_id", "")))


def _closed(request: Any) -> bool:
    """Whether the client of `request` has closed its connection (end of file, or a reset)."""
    connection = request._request_handler.connection
    if not select.select([connection], [], [], 0)[0]:
        return False
    try:
        return bool(connection.recv(1, socket.MSG_PEEK) == b"")
    except OSError:
        return True


def _gated(plain: Any, folder: Path, name_of: Callable[[Any], str]) -> Any:
    """A handler, holding a transfer of an object named by the pattern in FOLDER/hold while
    that file exists; FOLDER/held names the object held, FOLDER/gone says its client closed
    the connection meanwhile, FOLDER/drop refuses it once let go.
    The emulator serves one request at a time, so everything else waits too: the client
    cannot get past this point."""

    def handler(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        hold = folder / "hold"
        pattern = hold.read_text() if hold.exists() else ""
        name = name_of(request)
        if pattern and pattern in name:
            handler_of = request._request_handler
            client, server = handler_of.client_address[1], handler_of.server.server_address[1]
            (folder / "client").write_text(f"{client} {server}")
            (folder / "held").write_text(name)
            deadline = time.monotonic() + GATE_TIMEOUT
            while hold.exists() and time.monotonic() < deadline:
                if _closed(request):
                    (folder / "gone").write_text(name)
                time.sleep(0.02)
            if (folder / "drop").exists():
                raise ConnectionAbortedError(f"the held transfer of {name} was dropped")
        return plain(request, response, storage, *args, **kwargs)

    return handler


def serve(argv: list[str]) -> None:
    """Run `gcp-storage-emulator argv...` with objects.move added, the gate if asked, and a
    listen backlog that takes gcsfs's concurrent requests (a backlog of 5 drops the rest, each
    retried after 1 s)."""
    import http.server

    from gcp_storage_emulator import server
    from gcp_storage_emulator.__main__ import main
    from gcp_storage_emulator.handlers import objects

    http.server.HTTPServer.request_queue_size = BACKLOG
    move = r"^/storage/v1/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)/moveTo/o/"
    move += r"(?P<dest_object_id>.*[^/]+)$"
    handlers = tuple(
        (regex, {**methods, server.DELETE: _cancel_upload})
        if methods.get(server.PUT) is objects.upload_partial
        else (regex, methods)
        for regex, methods in server.HANDLERS
    )
    handlers = ((move, {server.POST: _move}), *handlers)
    gate = os.environ.get(GATE_VARIABLE)
    if gate:
        swaps = {}
        for call, name_of in (("insert", _upload_name), ("download", _object_name)):
            plain = getattr(objects, call)
            swaps[plain] = _gated(plain, Path(gate), name_of)
            setattr(objects, call, swaps[plain])  # what other handlers call, by this name
        handlers = tuple(
            (regex, {method: swaps.get(h, h) for method, h in methods.items()})
            for regex, methods in handlers
        )
    server.HANDLERS = handlers
    main(argv)


if __name__ == "__main__":
    serve(sys.argv[1:])
