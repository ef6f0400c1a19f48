"""Checkpoints that survive a lost VM: on gs://, resharded across strategies, never half-used."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from {{ cookiecutter.package_name }}.core.checkpoint_files import completed_steps

from backend_facts import MANY_DEVICES, REPLICATED, many
from gates import PATIENCE, Gate
from training_helpers import cli, popen, preempt, threads_left, write_config

pytestmark = pytest.mark.slow  # several end-to-end runs: `make test-fast` skips them

STEPS = 12
SHARDED = f"fsdp-x{MANY_DEVICES}"
STRATEGIES = {
    "one-device": ("--devices", "1", "--batch-size", "16"),
    SHARDED: (*many("fsdp"), "--batch-size", str(16 // MANY_DEVICES)),
}


def train(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    config = write_config(folder, max_steps=STEPS, log_every=1, seed=9, checkpoint_every=4)
    return cli("train", "--config", str(config), *args)


def losses(run_dir: Path) -> list[list[float]]:
    return list(json.loads((run_dir / "summary.json").read_text())["train_losses"])


@pytest.fixture(scope="module", params=list(STRATEGIES))
def uninterrupted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A run of each strategy that nothing stops: its losses and local checkpoints."""
    folder = tmp_path_factory.mktemp(request.param)
    done = train(folder, "--run-dir", str(folder / "run"), *STRATEGIES[request.param])
    assert done.returncode == 0, done.stderr[-3000:]
    return request.param, folder / "run"


@pytest.mark.interrupts
def test_preempted_run_continues_from_gcs_on_a_new_machine(
    uninterrupted: Any, gcs_bucket: str, gated_src: Path, tmp_path: Path
) -> None:
    """It resumes from gs:// after SIGTERM and the loss of the local disk, losses exact."""
    name, reference = uninterrupted
    strategy = STRATEGIES[name]
    remote = f"{gcs_bucket}/runs/{name}"
    first = tmp_path / "first-vm"
    gate = Gate(tmp_path / "gate", steps=8)  # SIGTERM after step 8
    config = write_config(
        tmp_path, gate=gate, max_steps=STEPS, log_every=1, seed=9, checkpoint_every=4
    )
    args = ("train", "--config", str(config), "--checkpoint-dir", remote, *strategy)
    stopped = preempt((*args, "--run-dir", str(first / "run"), "--resume", "auto"),
                      first / "run", gate, gated_src)  # fmt: skip
    assert stopped["checkpoint"].startswith(remote)
    shutil.rmtree(first)  # the VM is gone, and its disk with it

    second = tmp_path / "second-vm"
    resumed = cli(*args, "--run-dir", str(second / "run"), "--resume", "auto", src=gated_src)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming at step {stopped['steps']}" in resumed.stdout
    assert losses(second / "run") == losses(reference)


def test_checkpoints_evaluate_alike_on_one_device_and_under_fsdp(uninterrupted: Any) -> None:
    """It evaluates an fsdp checkpoint on one device and a one-device one under fsdp."""
    _, reference = uninterrupted
    results = []
    for args in (("--devices", "1", "--strategy", "single"), many("fsdp")):
        done = cli("eval", "--checkpoint", str(reference / "checkpoints"), *args)
        assert done.returncode == 0, done.stderr[-3000:]
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    one_device, sharded = results
    assert sharded == pytest.approx(one_device, rel=1e-5)


def test_checkpoint_resumes_under_another_strategy(uninterrupted: Any, tmp_path: Path) -> None:
    """It continues an fsdp run under the replicated strategy (spmd, ddp) and a one-device run
    under fsdp."""
    name, reference = uninterrupted
    other = many(REPLICATED if name == SHARDED else "fsdp")
    batch = ("--batch-size", str(16 // MANY_DEVICES))  # the same global batch of 16
    run_dir = tmp_path / "run"
    shutil.copytree(reference / "checkpoints", run_dir / "checkpoints")
    more = cli(
        "train", "--config", str(write_config(tmp_path, max_steps=STEPS + 4, log_every=1, seed=9)),
        "--run-dir", str(run_dir), "--resume", "latest", *other, *batch,
    )  # fmt: skip
    assert more.returncode == 0, more.stderr[-3000:]
    assert f"resuming at step {STEPS}" in more.stdout
    continued = losses(run_dir)
    assert [step for step, _ in continued][-4:] == list(range(STEPS + 1, STEPS + 5))
    assert continued[: len(losses(reference))] == losses(reference)


def _immutable(folder: Path) -> None:
    subprocess.run(["chattr", "+i", str(folder)], check=True)


def _undo_immutable(folder: Path) -> None:
    subprocess.run(["chattr", "-i", str(folder)], check=False)


@pytest.mark.interrupts
def test_unwritable_destination_stops_with_one_line_and_keeps_the_last_checkpoint(
    gated_src: Path, tmp_path: Path
) -> None:
    """It exits 4 with one line when a save cannot be written; earlier checkpoints load."""
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("making a directory unwritable to root needs chattr, as root")
    folder = tmp_path / "run" / "checkpoints"
    gate = Gate(tmp_path / "gate", steps=8)  # saves at 2 to 8, then waits for step 9
    config = write_config(
        tmp_path, gate=gate, max_steps=STEPS, log_every=1, checkpoint_every=2, seed=4
    )
    process = popen("train", "--config", str(config), "--run-dir", str(tmp_path / "run"),
                    src=gated_src)  # fmt: skip
    try:
        gate.wait_reached(process)
        deadline = time.monotonic() + PATIENCE
        while not completed_steps(str(folder)):  # written in the background meanwhile
            assert process.poll() is None, process.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "no checkpoint was written"
            time.sleep(0.01)
        _immutable(folder)
        gate.release()  # the saves of steps 6 to 12 meet the unwritable folder
        output, _ = process.communicate(timeout=300)
    finally:
        gate.release()
        process.kill()
        _undo_immutable(folder)
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert process.returncode == 4, output[-3000:]
    assert len(errors) == 1 and "cannot write" in errors[0], output[-3000:]
    assert "Traceback" not in output
    assert threads_left(output) == set()  # the batches' threads too: stopped, not cut off
    kept = completed_steps(str(folder))
    assert kept
    evaluated = cli("eval", "--checkpoint", str(folder / str(kept[-1])), src=gated_src)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]


def agreement_run(rank: int, port: int, stop_rank: int, stop_step: int, cadence: int) -> int:
    """One of two processes of a job: train-loop steps until the job agrees to stop."""
    import torch.distributed as dist
{% if cookiecutter.backend == "torch_tpu" %}
    from {{ cookiecutter.package_name }}.core.strategies import DataParallelProcesses

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    strategy = DataParallelProcesses("cpu", 2)  # one process each, met in the group above
{%- else %}
    from {{ cookiecutter.package_name }}.core.strategies import SpmdDataParallel

    class TwoHosts(SpmdDataParallel):
        """An spmd job of two hosts; XLA:CPU has one, so the host count is the group's."""

        def processes(self) -> int:
            return int(dist.get_world_size())

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    strategy = TwoHosts("cpu", 1)
{%- endif %}
    requested = False
    for step in range(1, 100):
        requested = requested or (rank == stop_rank and step == stop_step)  # SIGTERM here only
        if strategy.agree_to_stop(requested, step % cadence == 0):
            return step
    return -1


def test_hosts_agree_on_the_step_to_stop(tmp_path: Path) -> None:
    """It stops every host at the same step when only one was asked to (host exchange, gloo)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, __file__]
    children = [
        subprocess.Popen(
            [*command, str(rank), str(port)], env=env, stdout=subprocess.PIPE, text=True
        )
        for rank in (0, 1)
    ]
    stops = [int(child.communicate(timeout=120)[0].split()[-1]) for child in children]
    assert stops == [8, 8]  # asked at step 5 on host 1, agreed at the next cadence step


if __name__ == "__main__":
    print(agreement_run(int(sys.argv[1]), int(sys.argv[2]), stop_rank=1, stop_step=5, cadence=4))
