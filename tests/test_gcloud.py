"""The gcloud tier: a baked pod project's own make targets, through the real gcloud CLI and
real ssh, against a local stand-in of the Cloud TPU API.

The project is baked for v5p-16 (2 hosts of 4 chips). The stand-in (tpu_api_standin.py)
serves the TPU API and records every REST request; its node's two workers are
127.0.0.2 and 127.0.0.3, each with its own sshd and its own file system
(pod_workers.py). `make tpu-create` (plain, SPOT=1, QUEUED=1), `tpu-status`, `pod-sync`,
`train-pod` (2 steps on XLA:CPU on every worker), `pod-kill` and `tpu-delete` run as a
user runs them; the tests assert the requests gcloud sent and each worker's output.
Then the same targets with SLICES=2: one queued resource of two v5p-16 slices, whose
nodes tpu-project-0 and tpu-project-1 have the workers 127.0.0.2-3 and 127.0.0.4-5;
`train-pod` starts all four, each with its slice's multislice environment, which the
training process records (its Python is a wrapper that writes the environment it was
started with) and the transcript shows. What cannot run here: the slices' TPU runtimes
meeting over the data-center network (XLA:CPU has no multi-process collectives), so each
worker trains on its own.
The workers' image comes with the runtime: a virtual environment at the startup
script's place whose packages are this test run's (torch, torch_xla), so the startup
script finds them installed instead of downloading them.

Needs the gcloud CLI, root, and sshd (installed from Debian's openssh-server when
missing). Without them the tier skips with the reason, unless
TPU_TEMPLATE_REQUIRE_GCLOUD=1 (CI), where it fails. The transcript (every make target,
the REST calls it caused, each worker's output) is written to the pytest tmp dir; its
path is printed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pod_workers import Pod, WorkersUnavailable, start_pod
from tpu_api_standin import Request, StandIn
from users_shell import InstalledBake

pytestmark = pytest.mark.gcloud

ACCELERATOR_TYPE = "v5p-16"
ZONE = "us-east5-a"  # v5p's first zone: the baked default
RUNTIME = "v2-alpha-tpuv5"
GCP_PROJECT = "my-gcp-project"
SLUG = "tpu-project"
PACKAGE = "tpu_project"
WORKERS = 2  # per slice
SLICES = 2  # the multislice rehearsal; the single-slice tests use slice 0's workers
VENV = f"/opt/{SLUG}/.venv"  # where the startup script keeps the runtime
LOCATION = f"/v2/projects/{GCP_PROJECT}/locations/{ZONE}"
NODE = f"{LOCATION}/nodes/{SLUG}"
MAKE_TIMEOUT = 600
# The Python the multislice training runs: records the environment it starts with.
RECORDING_PYTHON = f"/opt/{SLUG}/recording-python"
RECORDED_ENV = "/home/worker/training-environment"
RECORDING_SCRIPT = f"""#!/bin/sh
env | grep -E '^(MEGASCALE_|TPU_WORKER_ID=|PJRT_DEVICE=)' | sort > {RECORDED_ENV}
exec {VENV}/bin/python "$@"
"""
# The example task shrunk to seconds on XLA:CPU.
TINY = {
    "task": "lm",
    "batch_size": 8,
    "eval_batch_size": 16,
    "task_options": {"seq_len": 16, "dim": 32, "layers": 1, "heads": 2, "max_bytes": 40000},
}


def unavailable(reason: str) -> None:
    """Skip the tier, or fail it when TPU_TEMPLATE_REQUIRE_GCLOUD=1."""
    if os.environ.get("TPU_TEMPLATE_REQUIRE_GCLOUD") == "1":
        pytest.fail(f"{reason} (required by TPU_TEMPLATE_REQUIRE_GCLOUD=1)", pytrace=False)
    pytest.skip(reason)


@dataclass
class Transcript:
    """What the tier did, in order: make targets, REST calls, output."""

    path: Path

    def write(self, text: str) -> None:
        with self.path.open("a", encoding="utf-8") as stream:
            stream.write(text)


@dataclass
class Ran:
    """One make target: its command line, exit code, output and the REST calls it caused."""

    command: str
    returncode: int
    stdout: str
    stderr: str
    calls: list[Request]

    def lines(self, worker: int, slice_index: int | None = None) -> list[str]:
        """Worker `worker`'s output lines (of slice `slice_index`), without their prefix."""
        label = (
            f"worker {worker}" if slice_index is None else f"slice {slice_index} worker {worker}"
        )
        prefix = f"[{label}] "
        return [line[len(prefix) :] for line in self.stdout.splitlines() if line.startswith(prefix)]


def call_line(request: Request) -> str:
    """A request for the transcript: the startup script's text shortened to its size."""
    body = json.dumps(request.body, sort_keys=True) if request.body is not None else ""
    if isinstance(request.body, dict):
        shown = json.loads(json.dumps(request.body))
        for metadata in _metadata_dicts(shown):
            for key in ("startup-script", "ssh-keys"):
                if key in metadata:
                    metadata[key] = f"<{key}: {len(metadata[key])} characters>"
        body = json.dumps(shown, sort_keys=True)
    return f"  {request.line()} {body}".rstrip()


def _metadata_dicts(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        if isinstance(value.get("metadata"), dict):
            yield value["metadata"]
        for item in value.values():
            yield from _metadata_dicts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _metadata_dicts(item)


@pytest.fixture(scope="module")
def tier_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gcloud-tier")


@pytest.fixture(scope="module")
def transcript(tier_dir: Path) -> Iterator[Transcript]:
    """The rehearsal's transcript file; its path is printed at the start and the end."""
    record = Transcript(tier_dir / "transcript.md")
    record.write("# make targets of a baked v5p-16 project, through gcloud and ssh\n\n")
    print(f"\ngcloud tier transcript: {record.path}")
    started = time.monotonic()
    yield record
    record.write(f"\n[tier took {time.monotonic() - started:.0f} s]\n")
    print(f"\ngcloud tier transcript: {record.path}")


@pytest.fixture(scope="module")
def gcloud() -> str:
    found = shutil.which("gcloud")
    if not found:
        unavailable("the gcloud CLI is not installed")
    assert found
    return found


@pytest.fixture(scope="module")
def pod(gcloud: str, tier_dir: Path) -> Iterator[Pod]:
    """Two slices of two workers, each behind its own sshd on 127.0.0.2 ... 127.0.0.5."""
    try:
        # This machine's packages stand for the runtime a TPU image has (see `image`).
        runtime = Path(sysconfig.get_paths()["purelib"])
        workers = start_pod(
            tier_dir / "pod", WORKERS * SLICES, shared=[runtime], hosts_per_slice=WORKERS
        )
    except WorkersUnavailable as error:
        unavailable(f"no pod workers here: {error}")
        raise
    yield workers
    workers.stop()


@pytest.fixture(scope="module")
def standin(pod: Pod) -> Iterator[StandIn]:
    """The TPU API stand-in, booting the pod's workers when a node is created."""
    api = StandIn(
        workers=[w.address for w in pod.workers],
        host_keys=[w.host_key for w in pod.workers],
        authorized_keys=pod.authorized_keys,
        boot=pod.boot,
        hosts_per_node=WORKERS,
    ).start()
    yield api
    api.wait_for_boots()
    api.stop()


@pytest.fixture(scope="module")
def project(
    tier_dir: Path, run_cookiecutter: Callable[..., subprocess.CompletedProcess[str]]
) -> Path:
    """The default bake for v5p-16, with a tiny training config for the rehearsal."""
    out = tier_dir / "bake"
    out.mkdir()
    baked = run_cookiecutter(out, context={"accelerator_type": ACCELERATOR_TYPE})
    assert baked.returncode == 0, baked.stderr
    path = out / SLUG
    (path / "configs" / "rehearsal.yaml").write_text(yaml.safe_dump(TINY), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def image(pod: Pod) -> None:
    """Give every worker the runtime its image would get from the startup script."""
    site_packages = sysconfig.get_paths()["purelib"]
    base_python = getattr(sys, "_base_executable", sys.executable)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    pth = f"{VENV}/lib/{version}/site-packages/runtime-from-image.pth"
    command = (
        f"{shlex.quote(base_python)} -m venv --without-pip {VENV} && "
        f"echo {shlex.quote(site_packages)} > {pth}"
    )
    for worker in range(WORKERS * SLICES):
        made = pod.run(worker, command)
        assert made.returncode == 0, made.stdout + made.stderr
        recorder = pod.workers[worker].path(RECORDING_PYTHON)
        recorder.write_text(RECORDING_SCRIPT, encoding="utf-8")
        recorder.chmod(0o755)


MakeIn = Callable[[Path, Path], Callable[..., "Ran"]]


@pytest.fixture(scope="module")
def make_in(standin: StandIn, image: None, transcript: Transcript, tier_dir: Path) -> MakeIn:
    """`make TARGET VAR=...` in a baked project with a virtual environment's tools, as a user
    with gcloud would run it."""
    client = tier_dir / "client-home"  # gcloud's config and ssh key live here
    (client / "gcloud").mkdir(parents=True)

    def make_in(project: Path, venv: Path) -> Callable[..., Ran]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CLOUDSDK_", "SSH_"))}
        env.update(standin.gcloud_environment(client / "gcloud", GCP_PROJECT))
        env.update(
            HOME=str(client),
            PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
            PYTHONPATH=str(project / "src"),
            PYTHONUNBUFFERED="1",
        )
        env.pop("PYTEST_ADDOPTS", None)

        def run(*args: str) -> Ran:
            first = len(standin.requests)
            command = ["make", "--no-print-directory", f"VENV={venv}", *args]
            started = time.monotonic()
            result = subprocess.run(
                command,
                cwd=project,
                env=env,
                capture_output=True,
                text=True,
                timeout=MAKE_TIMEOUT,
                check=False,
            )
            ran = Ran(
                shlex.join(["make", *args]),
                result.returncode,
                result.stdout,
                result.stderr,
                standin.requests[first:],
            )
            transcript.write(
                f"## $ {ran.command}  ({project.name}, {venv})\n\n[exit {ran.returncode} "
                f"after {time.monotonic() - started:.1f} s]\n\nREST calls:\n"
                + "".join(call_line(call) + "\n" for call in ran.calls)
                + f"\nstdout:\n{ran.stdout}\nstderr:\n{ran.stderr}\n"
            )
            return ran

        return run

    return make_in


@pytest.fixture(scope="module")
def make(project: Path, make_in: MakeIn) -> Callable[..., Ran]:
    """`make` in the default bake, with this test run's environment."""
    return make_in(project, Path(sys.prefix))


def poll_status(make: Callable[..., Ran], standin: StandIn, *args: str) -> Ran:
    """`make tpu-status` as a user polls it, until it succeeds or the startup scripts have
    ended: a status asked after they ended is final. No deadline: a slow boot only waits."""
    while True:
        booting = [boot for boot in standin.boots if boot.is_alive()]
        ran = make("tpu-status", *args)
        if ran.returncode == 0 or not booting:
            return ran
        booting[0].join(timeout=2)  # between asks, as a user waits


def succeeded(ran: Ran) -> None:
    assert ran.returncode == 0, f"{ran.command} exited {ran.returncode}\n{ran.stdout}{ran.stderr}"


def node_body(ran: Ran) -> dict[str, Any]:
    (create,) = [c for c in ran.calls if c.method == "POST" and c.path == f"{LOCATION}/nodes"]
    assert create.query["nodeId"] == [SLUG]
    return dict(create.body)


def test_tpu_create_sends_the_node_with_its_startup_script(
    make: Callable[..., Ran], project: Path
) -> None:
    """It creates the TPU VM with the type, runtime and startup script, on-demand."""
    ran = make("tpu-create")
    succeeded(ran)
    body = node_body(ran)
    assert body["acceleratorType"] == ACCELERATOR_TYPE
    assert body["runtimeVersion"] == RUNTIME
    startup = (project / "scripts" / "tpu-startup.sh").read_text(encoding="utf-8")
    assert body["metadata"] == {"startup-script": startup}
    assert body["schedulingConfig"] == {"preemptible": False, "reserved": False, "spot": False}


def test_tpu_status_shows_the_startup_script_done_on_every_worker(
    make: Callable[..., Ran], standin: StandIn, pod: Pod
) -> None:
    """It reports READY, each worker's startup progress and readiness, as the user polls it."""
    ran = poll_status(make, standin)
    boots = [
        (w.folder / "boot.log").read_text()
        for w in pod.workers[:WORKERS]
        if (w.folder / "boot.log").exists()
    ]
    assert ran.returncode == 0, f"{ran.stdout}{ran.stderr}\nboot logs: {boots}"
    assert f"READY\tHEALTHY\t{ACCELERATOR_TYPE}" in ran.stdout.splitlines()
    guest = [line.split() for line in ran.stdout.splitlines() if line.startswith(SLUG)]
    assert [(row[1], row[2], " ".join(row[3:])) for row in guest] == [
        ("startup", str(w), "4/4 ready") for w in range(WORKERS)
    ]
    for worker in range(WORKERS):
        (line,) = [line for line in ran.lines(worker) if "ready: " in line]
        assert line.startswith("ready: ") and line.endswith("step 4/4: ready"), line
    assert f"pod: {WORKERS}/{WORKERS} workers ready" in ran.stderr
    queries = [c.body for c in ran.calls if c.path.endswith(":getGuestAttributes")]
    assert {"queryPath": f"{SLUG}/"} in queries
    # gcloud had no ssh key: one first connection made it and put it in the node's metadata.
    patches = [c for c in standin.requests if c.method == "PATCH"]
    assert [c.query["updateMask"] for c in patches] == [["metadata"]]
    ssh_keys = patches[0].body["metadata"]["ssh-keys"]
    assert ssh_keys.strip().startswith("root:ssh-rsa ")
    assert ssh_keys.split(":", 1)[1].strip() in pod.authorized_keys.read_text()
    for each in pod.workers[:WORKERS]:
        log = each.path(f"/var/log/{SLUG}-startup.log").read_text()
        assert "torch 2.9.0 is installed" in log, log


def test_pod_sync_copies_and_installs_the_project_on_every_worker(
    make: Callable[..., Ran], pod: Pod, project: Path
) -> None:
    """It copies the project into each worker's own home and installs it into its runtime."""
    ran = make("pod-sync")
    succeeded(ran)
    assert f"pod: {WORKERS}/{WORKERS} workers succeeded" in ran.stderr
    source = project / "src" / PACKAGE / "pod" / "fanout.py"
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for worker in pod.workers[:WORKERS]:
        copy = worker.home / SLUG
        assert (copy / "src" / PACKAGE / "pod" / "fanout.py").read_bytes() == source.read_bytes()
        assert (copy / "configs" / "rehearsal.yaml").is_file()
        installed = worker.path(f"{VENV}/lib/{version}/site-packages")
        assert list(installed.glob(f"{PACKAGE.replace('_', '?')}-0.1.0.dist-info")), list(
            installed.iterdir()
        )


def test_train_pod_trains_two_steps_on_every_worker(make: Callable[..., Ran], pod: Pod) -> None:
    """It trains on every worker at once through gcloud ssh, each line marked with its worker."""
    ran = make(
        "train-pod",
        "POD_TRAIN=--accelerator cpu --devices 1",
        "ARGS=--config configs/rehearsal.yaml --max-steps 2 --log-every 1 --eval-every 0",
    )
    succeeded(ran)
    for worker in range(WORKERS):
        lines = ran.lines(worker)
        assert any(line.startswith("step 2/2 train loss=") for line in lines), lines
        assert any("completed: 2 steps" in line for line in lines), lines
        summary = pod.workers[worker].home / SLUG / "runs" / "default" / "summary.json"
        assert summary.is_file()
    assert f"pod: {WORKERS}/{WORKERS} workers succeeded" in ran.stderr
    # One gcloud ssh per worker, each asking for its worker's host key; no key to add.
    guest = [c.body for c in ran.calls if c.path == f"{NODE}:getGuestAttributes"]
    assert sorted(b["workerIds"] for b in guest) == [[str(w)] for w in range(WORKERS)]
    assert not [c for c in ran.calls if c.method == "PATCH"]


def test_the_docs_worker_commands_run_as_written_on_a_synced_worker(
    make: Callable[..., Ran], pod: Pod
) -> None:
    """It installs an extra on every worker with `make pod-sync EXTRAS=wandb`, then on worker
    0, in the synced project as `make tpu-ssh` leaves a user there, runs `make prepare` and
    `make train-single` as the docs write them: with the startup script's environment, the
    only one a worker has."""
    synced = make("pod-sync", "EXTRAS=wandb")
    succeeded(synced)
    assert f"pod: {WORKERS}/{WORKERS} workers succeeded" in synced.stderr
    home = pod.workers[0].home / SLUG
    assert not (home / ".venv").exists()  # pod sync copies none: the worker's is /opt's
    lines = [json.dumps({"text": f"def f{i}(x):\n    return x * {i}\n"}) for i in range(400)]
    (home / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    options = "ARGS='--config configs/rehearsal.yaml'"
    prepared = pod.run(
        0, f"cd {SLUG} && make prepare INPUTS=corpus.jsonl OUT=data/corpus {options}"
    )
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    assert f"{VENV}/bin/python -m {PACKAGE} prepare corpus.jsonl" in prepared.stdout
    assert (home / "data" / "corpus").is_dir()
    train = (
        "make train-single ACCELERATOR=cpu CONFIG=configs/rehearsal.yaml "
        "ARGS='--data data/corpus --max-steps 2 --log-every 1 --eval-every 0 --run-dir runs/w0'"
    )
    trained = pod.run(0, f"cd {SLUG} && {train}")
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert "steps: 2 (max_steps)" in trained.stdout, trained.stdout
    assert (home / "runs" / "w0" / "summary.json").is_file()


def test_pod_kill_frees_the_tpu_on_every_worker(make: Callable[..., Ran], pod: Pod) -> None:
    """It runs the kill script on every worker and drops each worker's own libtpu lockfile."""
    for worker in pod.workers[:WORKERS]:
        worker.path("/tmp/libtpu_lockfile").touch()
    ran = make("pod-kill")
    succeeded(ran)
    for worker in pod.workers[:WORKERS]:
        assert ran.lines(worker.index)[-2:] == [
            "no process holds the TPU",
            "removed /tmp/libtpu_lockfile",
        ]
        assert not worker.path("/tmp/libtpu_lockfile").exists()


def test_tpu_delete_deletes_the_node(make: Callable[..., Ran], standin: StandIn) -> None:
    """It deletes the TPU VM; describing it afterwards fails with gcloud's NOT_FOUND."""
    ran = make("tpu-delete")
    succeeded(ran)
    assert [c.line() for c in ran.calls if c.method == "DELETE"] == [f"DELETE {NODE}?alt=json"]
    assert standin.nodes == {}
    gone = make("tpu-status")
    assert gone.returncode != 0
    assert "NOT_FOUND" in gone.stderr


def test_spot_tpu_create_asks_for_spot_scheduling(make: Callable[..., Ran]) -> None:
    """It creates a spot TPU VM with SPOT=1."""
    ran = make("tpu-create", "SPOT=1")
    succeeded(ran)
    body = node_body(ran)
    assert body["schedulingConfig"] == {"preemptible": False, "reserved": False, "spot": True}
    assert body["acceleratorType"] == ACCELERATOR_TYPE
    succeeded(make("tpu-delete"))


def test_queued_tpu_create_sends_a_queued_resource(
    make: Callable[..., Ran], standin: StandIn
) -> None:
    """It asks for a queued resource with QUEUED=1 and deletes it with its TPU."""
    ran = make("tpu-create", "QUEUED=1", "SPOT=1")
    succeeded(ran)
    (create,) = [c for c in ran.calls if c.method == "POST"]
    assert create.path == f"{LOCATION}/queuedResources"
    assert create.query["queuedResourceId"] == [SLUG]
    (spec,) = create.body["tpu"]["nodeSpec"]
    assert spec["nodeId"] == SLUG
    assert spec["node"]["acceleratorType"] == ACCELERATOR_TYPE
    assert spec["node"]["runtimeVersion"] == RUNTIME
    assert spec["node"]["metadata"]["startup-script"].startswith("#!/usr/bin/env bash\n")
    assert create.body["spot"] == {}
    deleted = make("tpu-delete", "QUEUED=1")
    succeeded(deleted)
    (delete,) = [c for c in deleted.calls if c.method == "DELETE"]
    assert delete.path == f"{LOCATION}/queuedResources/{SLUG}"
    assert delete.query["force"] == ["True"]
    assert standin.nodes == {} and standin.queued_resources == {}


# -- several slices: one queued resource of SLICES v5p-16 slices ----------------------------

NODES = [f"{SLUG}-{index}" for index in range(SLICES)]
COORDINATOR = "127.0.0.2:8081"  # worker 0 of slice 0, on the port the slices talk on


def test_slices_the_type_cannot_form_are_refused_before_any_request(
    make: Callable[..., Ran],
) -> None:
    """It refuses SLICES=2 of a v3 (no multislice) with one error line and sends nothing."""
    ran = make("tpu-create", f"SLICES={SLICES}", "ACCELERATOR_TYPE=v3-8")
    assert ran.returncode == 2, ran.stdout + ran.stderr
    # make adds its own `make: *** [...] Error 2` after the command's line.
    errors = [line for line in ran.stderr.splitlines() if not re.match(r"make(\[\d+\])?: ", line)]
    assert len(errors) == 1 and errors[0].startswith("error: 2 slices of v3-8"), ran.stderr
    assert ran.calls == []
    assert "gcloud compute" not in ran.stdout


def test_multislice_tpu_create_sends_one_queued_resource_of_every_slice(
    make: Callable[..., Ran], standin: StandIn, project: Path
) -> None:
    """It asks for one queued resource of SLICES nodes named after the TPU, one per slice."""
    ran = make("tpu-create", f"SLICES={SLICES}")
    succeeded(ran)
    (create,) = [c for c in ran.calls if c.method == "POST"]
    assert create.path == f"{LOCATION}/queuedResources"
    assert create.query["queuedResourceId"] == [SLUG]
    (spec,) = create.body["tpu"]["nodeSpec"]
    assert "nodeId" not in spec
    assert spec["multisliceParams"] == {"nodeCount": SLICES, "nodeIdPrefix": SLUG}
    assert spec["node"]["acceleratorType"] == ACCELERATOR_TYPE
    assert spec["node"]["runtimeVersion"] == RUNTIME
    startup = (project / "scripts" / "tpu-startup.sh").read_text(encoding="utf-8")
    assert spec["node"]["metadata"] == {"startup-script": startup}
    created = {name.rsplit("/", 1)[1]: node for name, node in standin.nodes.items()}
    assert sorted(created) == NODES
    addresses = [[e["ipAddress"] for e in created[n]["networkEndpoints"]] for n in NODES]
    assert addresses == [["127.0.0.2", "127.0.0.3"], ["127.0.0.4", "127.0.0.5"]]


def test_multislice_tpu_status_shows_every_slice_ready(
    make: Callable[..., Ran], standin: StandIn
) -> None:
    """It reports the queued resource ACTIVE, each slice READY and every worker ready."""
    ran = poll_status(make, standin, f"SLICES={SLICES}")
    succeeded(ran)
    lines = ran.stdout.splitlines()
    assert "ACTIVE" in lines
    assert lines.count(f"READY\tHEALTHY\t{ACCELERATOR_TYPE}") == SLICES
    for index in range(SLICES):
        for worker in range(WORKERS):
            (line,) = [line for line in ran.lines(worker, index) if "ready: " in line]
            assert line.startswith("ready: "), line
            # Slice 0's workers were prepared by the first node's boot, and say so now.
            assert line.endswith("step 4/4: ready" if index else "nothing to do"), line
    assert f"pod: {WORKERS * SLICES}/{WORKERS * SLICES} workers ready" in ran.stderr
    queried = {c.path for c in ran.calls if c.path.endswith(":getGuestAttributes")}
    assert queried == {f"{LOCATION}/nodes/{node}:getGuestAttributes" for node in NODES}


def test_multislice_pod_sync_installs_the_project_on_every_worker_of_every_slice(
    make: Callable[..., Ran], pod: Pod, project: Path
) -> None:
    """It copies the project into every worker's home, slice by slice, and installs it."""
    ran = make("pod-sync", f"SLICES={SLICES}")
    succeeded(ran)
    assert f"pod: {WORKERS * SLICES}/{WORKERS * SLICES} workers succeeded" in ran.stderr
    source = (project / "src" / PACKAGE / "pod" / "fanout.py").read_bytes()
    for worker in pod.workers:
        assert (worker.home / SLUG / "src" / PACKAGE / "pod" / "fanout.py").read_bytes() == source


def test_multislice_train_pod_starts_every_worker_with_its_slice_environment(
    make: Callable[..., Ran], pod: Pod, transcript: Transcript
) -> None:
    """It trains on every worker of every slice at once, each started with the multislice
    environment of its slice: worker 0 of slice 0 as coordinator, 2 slices, its slice id."""
    ran = make(
        "train-pod",
        f"SLICES={SLICES}",
        f"POD_TRAIN=--python {RECORDING_PYTHON} --accelerator cpu --devices 1",
        # A run of its own: slice 0's workers hold the finished run of the one-slice test.
        "ARGS=--config configs/rehearsal.yaml --run-dir runs/multislice --max-steps 2"
        " --log-every 1 --eval-every 0",
    )
    succeeded(ran)
    assert f"pod: {WORKERS * SLICES}/{WORKERS * SLICES} workers succeeded" in ran.stderr
    recorded = []
    for worker in pod.workers:
        lines = ran.lines(worker.worker_id, worker.slice)
        assert any("completed: 2 steps" in line for line in lines), lines
        environment = worker.path(RECORDED_ENV).read_text(encoding="utf-8")
        recorded.append(
            f"[slice {worker.slice} worker {worker.worker_id}] ({worker.address})\n{environment}"
        )
        assert environment.splitlines() == [
            f"MEGASCALE_COORDINATOR_ADDRESS={COORDINATOR}",
            f"MEGASCALE_NUM_SLICES={SLICES}",
            "MEGASCALE_PORT=8081",
            f"MEGASCALE_SLICE_ID={worker.slice}",
            "PJRT_DEVICE=CPU",
            f"TPU_WORKER_ID={worker.worker_id}",
        ]
    transcript.write(
        "## The environment each training process started with (make train-pod SLICES=2)\n\n"
        + "\n".join(recorded)
        + "\n"
    )
    described = {c.path for c in ran.calls if c.method == "GET" and "/nodes/" in c.path}
    assert described == {f"{LOCATION}/nodes/{node}" for node in NODES}


def test_multislice_pod_kill_and_tpu_delete_reach_every_slice(
    make: Callable[..., Ran], pod: Pod, standin: StandIn
) -> None:
    """It frees the TPU on every worker of every slice, then deletes the queued resource."""
    for worker in pod.workers:
        worker.path("/tmp/libtpu_lockfile").touch()
    ran = make("pod-kill", f"SLICES={SLICES}")
    succeeded(ran)
    for worker in pod.workers:
        assert ran.lines(worker.worker_id, worker.slice)[-1] == "removed /tmp/libtpu_lockfile"
        assert not worker.path("/tmp/libtpu_lockfile").exists()
    deleted = make("tpu-delete", f"SLICES={SLICES}")
    succeeded(deleted)
    (delete,) = [c for c in deleted.calls if c.method == "DELETE"]
    assert delete.path == f"{LOCATION}/queuedResources/{SLUG}"
    assert delete.query["force"] == ["True"]
    assert standin.nodes == {} and standin.queued_resources == {}


# ---- the torch_tpu bake: one job over the slice's two hosts ----------------------------------
TORCH_TPU_STEPS = 20
TORCH_TPU_TOLERANCE = 2e-3  # what its own suite allows a layout against one process
TORCH_TPU_RUN = "runs/torch-tpu"


@pytest.fixture(scope="module")
def torch_tpu_project(tier_dir: Path, run_cookiecutter: Callable[..., Any]) -> Path:
    """The torch_tpu bake for v5p-16, with the rehearsal's config."""
    out = tier_dir / "torch-tpu-bake"
    out.mkdir()
    context = {"accelerator_type": ACCELERATOR_TYPE, "backend": "torch_tpu"}
    baked = run_cookiecutter(out, context=context)
    assert baked.returncode == 0, baked.stderr
    path = out / SLUG
    config = {**TINY, "batch_size": 4}  # a process's: 8 over the job's two
    (path / "configs" / "rehearsal.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def test_torch_tpu_train_pod_is_one_job_over_two_hosts_with_one_process_losses(
    make_in: MakeIn,
    torch_tpu_project: Path,
    torch_tpu_installed: InstalledBake,
    pod: Pod,
    standin: StandIn,
    tmp_path: Path,
) -> None:
    """The torch_tpu bake's tpu-create, pod-sync and train-pod through gcloud ssh: each
    worker's launcher finds the slice's hosts and its own place (TPU_WORKER_HOSTNAMES and
    TPU_WORKER_ID, which a TPU VM's metadata gives), the two meet in one torchrun job over
    gloo (ddp, a process a host), and its losses are one process's with the same global batch."""
    venv = torch_tpu_installed.project / ".venv"
    runtime = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c",
             "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    # The workers' image: TorchTPU's torch in the runtime's place (torch-tpu itself cannot be
    # installed without a TPU: the startup script's attempt fails, and training runs on CPU).
    pod.share([runtime])
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    pth = f"{VENV}/lib/{version}/site-packages/runtime-from-image.pth"
    for each in pod.workers[:WORKERS]:
        each.path(pth).write_text(f"{runtime}\n", encoding="utf-8")
    make = make_in(torch_tpu_project, venv)
    try:
        succeeded(make("tpu-create"))
        standin.wait_for_boots()
        succeeded(make("pod-sync"))
        ran = make(
            "train-pod",
            "POD_TRAIN=--accelerator cpu --devices 1",
            f"ARGS=--config configs/rehearsal.yaml --max-steps {TORCH_TPU_STEPS} --log-every 1 "
            f"--eval-every 0 --run-dir {TORCH_TPU_RUN}",  # not the default bake's run there
        )
        succeeded(ran)
    finally:
        make("pod-kill")
        make("tpu-delete")
        for each in pod.workers[:WORKERS]:
            each.path(pth).write_text(f"{sysconfig.get_paths()['purelib']}\n", encoding="utf-8")
    summaries = [w.home / SLUG / TORCH_TPU_RUN / "summary.json" for w in pod.workers[:WORKERS]]
    assert not summaries[1].exists()  # the job's first process writes it
    job = json.loads(summaries[0].read_text(encoding="utf-8"))
    assert (job["strategy"], job["devices"], job["global_batch"]) == ("ddp", 2, 8)
    assert any(
        line.startswith(f"step {TORCH_TPU_STEPS}/{TORCH_TPU_STEPS} train loss=")
        for line in ran.lines(0)
    )
    # Both hosts end with the job's evaluation, the same numbers: one job, not two runs.
    evaluations = [[json.loads(line) for line in ran.lines(w) if line.startswith('{"loss"')]
                   for w in range(WORKERS)]  # fmt: skip
    assert evaluations[0] and evaluations[0] == evaluations[1], evaluations

    # One process with the job's global batch, on this machine.
    reference = subprocess.run(
        [str(venv / "bin" / "python"), "-m", PACKAGE, "train", "--config",
         "configs/rehearsal.yaml", "--set", "batch_size=8", "--accelerator", "cpu",
         "--devices", "1",
         "--max-steps", str(TORCH_TPU_STEPS), "--log-every", "1", "--eval-every", "0",
         "--run-dir", str(tmp_path / "one-process")],
        cwd=torch_tpu_project,
        env={**torch_tpu_installed.env, "PYTHONPATH": str(torch_tpu_project / "src")},
        capture_output=True, text=True, timeout=MAKE_TIMEOUT, check=False,
    )  # fmt: skip
    assert reference.returncode == 0, reference.stdout[-3000:] + reference.stderr[-3000:]
    alone = json.loads((tmp_path / "one-process" / "summary.json").read_text(encoding="utf-8"))
    assert (alone["devices"], alone["global_batch"]) == (1, 8)
    expected = alone["train_losses"]
    assert [step for step, _ in expected] == list(range(1, TORCH_TPU_STEPS + 1))
    for (step, loss), (_, one) in zip(job["train_losses"], expected, strict=True):
        assert loss == pytest.approx(one, rel=TORCH_TPU_TOLERANCE), step
