"""The torch_tpu backend's choices, refused or resolved before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from {{ cookiecutter.package_name }}.core import launcher, runtime, tpu_generations
from {{ cookiecutter.package_name }}.core.precision import Precision
from {{ cookiecutter.package_name }}.core.runtime import RuntimeConfigError

from training_helpers import cli, write_config


def test_auto_is_single_on_one_device_and_ddp_on_more():
    """It runs one device alone and several as one DDP process each."""
    assert launcher.make_plan("cpu", 1).strategy.name == "single"
    assert launcher.make_plan("cpu", 4).strategy.name == "ddp"


def test_spmd_is_refused_with_what_to_use():
    """It refuses torch_xla's one-process-per-host strategy and names ddp and fsdp."""
    with pytest.raises(RuntimeConfigError, match="use --strategy ddp or fsdp"):
        launcher.make_plan("cpu", 4, "spmd")


def test_a_mesh_must_fit_the_processes_and_have_known_axes():
    """It refuses a mesh of another size, an expert axis, and a mesh without fsdp."""
    with pytest.raises(RuntimeConfigError, match="has 8 devices but the job has 4"):
        launcher.make_plan("cpu", 4, "fsdp", "fsdp=8")
    with pytest.raises(RuntimeConfigError, match="not offered by the torch_tpu backend"):
        launcher.make_plan("cpu", 4, "fsdp", "fsdp=2,expert=2")
    with pytest.raises(RuntimeConfigError, match="needs a 'fsdp' axis"):
        launcher.make_plan("cpu", 4, "fsdp", "data=4")
    assert launcher.make_plan("cpu", 4, "fsdp", "fsdp=2,tensor=2").strategy.mesh_axes() == {
        "fsdp": 2,
        "tensor": 2,
    }


def test_fsdp_times_tensor_reads_one_batch_per_tensor_group(monkeypatch):
    """It gives the two processes of a tensor group the same data, and the groups apart."""
    strategy = launcher.make_plan("cpu", 4, "fsdp", "fsdp=2,tensor=2").strategy
    monkeypatch.setenv("WORLD_SIZE", "4")
    layouts = []
    for rank in range(4):
        monkeypatch.setenv("RANK", str(rank))
        layouts.append(strategy.data_layout())
    assert layouts == [(2, 0), (2, 0), (2, 1), (2, 1)]


def test_scan_layers_and_legacy_bf16_are_refused():
    """It refuses torch_xla's scan and XLA_USE_BF16 mode in one line each."""
    with pytest.raises(RuntimeConfigError, match="torch_xla's scan"):
        launcher.make_plan("cpu", 1).strategy.check_scan()
    with pytest.raises(ValueError, match="use bf16-true"):
        Precision.from_name("bf16-env")


# What only torch_xla offers, asked of this backend on the command line: (args, the refusal).
TORCH_XLA_ONLY = {
    "spmd": (["--strategy", "spmd", "--devices", "2"], "use --strategy ddp or fsdp"),
    "context-axis": (
        ["--strategy", "fsdp", "--devices", "2", "--mesh", "context=2"],
        "mesh axis 'context' is not offered by the torch_tpu backend",
    ),
    "expert-axis": (
        ["--strategy", "fsdp", "--devices", "2", "--mesh", "fsdp=1,expert=2"],
        "mesh axis 'expert' is not offered by the torch_tpu backend",
    ),
    "bf16-env": (["--precision", "bf16-env"], "use bf16-true"),
    "scan-layers": (["--set", "scan_layers=true"], "torch_xla's scan"),
    "compile-cache": (["--set", "compile_cache=/tmp/cache"], "compile_cache = '/tmp/cache' is"),
    "profile-port": (["--set", "profile_port=9013"], "opens no profiler server"),
    "slices": (["--env-slices"], "lays no device mesh over slices"),
}


@pytest.mark.parametrize(("args", "refusal"), TORCH_XLA_ONLY.values(), ids=TORCH_XLA_ONLY)
def test_what_only_torch_xla_offers_is_refused_in_one_line_before_a_run(
    tmp_path: Path, args: list[str], refusal: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It refuses each of torch_xla's own settings in one line, exit 2, before the run writes
    anything."""
    if args == ["--env-slices"]:  # what the pod launcher sets for two slices
        args = []
        monkeypatch.setenv("MEGASCALE_NUM_SLICES", "2")
        monkeypatch.setenv("MEGASCALE_SLICE_ID", "0")
    config = write_config(tmp_path, max_steps=2)
    run_dir = tmp_path / "run"
    done = cli("train", "--config", str(config), "--run-dir", str(run_dir), *args)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert refusal in lines[0], lines[0]
    assert not run_dir.exists()


def test_generations_torch_tpu_cannot_run_are_refused():
    """It refuses a v3 slice in one line naming the backend, and knows TPU7x."""
    with pytest.raises(tpu_generations.UnknownAcceleratorType, match="does not run on torch_tpu"):
        tpu_generations.parse("v3-8")
    assert runtime.topology("tpu7x-8").hosts == 1
    assert runtime.topology("v5p-16").hosts == 2


def test_no_torch_xla_in_the_package():
    """It imports nothing of torch_xla: the package's core is TorchTPU's."""
    from pathlib import Path

    import {{ cookiecutter.package_name }} as package

    root = Path(package.__file__).parent
    found = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if "import torch_xla" in path.read_text() or "from torch_xla" in path.read_text()
    ]
    # BlockStack's scan, refused above before it runs; attention's flash kernel and mesh,
    # reached only by tensors on an XLA device.
    assert sorted(found) == ["core/attention.py", "core/layers.py"]


def test_fsdp_gives_the_embedding_and_an_untied_head_units_of_their_own():
    """It shards a decoder's embedding and head apart from what the model's own unit keeps
    gathered (norms), and leaves a head tied to the embedding in the model's unit."""
    from torch import nn

    from {{ cookiecutter.package_name }}.core.strategies.fsdp import _outer_units

    class Decoder(nn.Module):
        def __init__(self, tied: bool) -> None:
            super().__init__()
            self.embed = nn.Embedding(32, 8)
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8)) for _ in range(2))
            self.norm = nn.LayerNorm(8)
            self.head = nn.Linear(8, 32, bias=False)
            if tied:
                self.head.weight = self.embed.weight

    untied, tied = Decoder(tied=False), Decoder(tied=True)
    assert _outer_units(untied, list(untied.blocks)) == [untied.embed, untied.head]
    assert _outer_units(tied, list(tied.blocks)) == []
