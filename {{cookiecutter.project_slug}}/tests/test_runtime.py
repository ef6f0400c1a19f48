"""The runtime starts only when asked, finds the accelerator, knows every TPU slice from
one table, and reports the step's health."""

import json
import platform
import re
from pathlib import Path

import pytest
import torch

from {{ cookiecutter.package_name }}.core import (
    HealthError,
    RuntimeConfigError,
    StepGuard,
    detect_accelerator,
    ops,
    runtime,
    tpu_generations,
)

from backend_facts import ACCELERATOR_SETTINGS, NAME, TRANSFER

DOCS = Path(__file__).resolve().parents[1] / "docs" / "tpu-generations.md"

IMPORT_CHILD = """
import json
import {{ cookiecutter.package_name }}
import {{ cookiecutter.package_name }}.core
import {{ cookiecutter.package_name }}.cli
import {{ cookiecutter.package_name }}.training
from {{ cookiecutter.package_name }}.core import runtime

print(json.dumps({"runtime_started": runtime.runtime_initialized()}))
"""


def test_importing_the_package_does_not_start_the_runtime(python_subprocess):
    """It imports the package, core, cli and training without starting the backend's runtime
    (torch_xla's XLA runtime, torch_tpu's process group)."""
    result = python_subprocess(["-c", IMPORT_CHILD])

    assert result["runtime_started"] is False


def test_auto_detects_the_cpu_without_a_tpu(monkeypatch):
    """It resolves 'auto' to 'cpu' on a host without a TPU and without an accelerator set."""
    for name in ACCELERATOR_SETTINGS:
        monkeypatch.delenv(name, raising=False)

    assert detect_accelerator("auto") == "cpu"


def test_requesting_a_missing_tpu_says_what_to_do(monkeypatch):
    """It refuses 'tpu' on a host without one and suggests --accelerator cpu."""
    for name in ACCELERATOR_SETTINGS:
        monkeypatch.delenv(name, raising=False)

    with pytest.raises(RuntimeConfigError, match=r"no TPU was found.*--accelerator cpu"):
        detect_accelerator("tpu")


def test_unknown_accelerator_is_rejected():
    """It rejects an accelerator name it does not know, listing the choices."""
    with pytest.raises(RuntimeConfigError, match="auto, tpu, cpu"):
        detect_accelerator("gpu")


# The generations this backend runs (v2 and v3: torch_xla only), and slices of each generation.
RUNS = {key for key, g in tpu_generations.generations().items() if NAME in g.backends}
TOPOLOGIES = [
    ("v2-8", 1, 8),
    ("v3-8", 1, 8),
    ("v3-32", 4, 8),
    ("v4-8", 1, 4),
    ("v4-32", 4, 4),
    ("v5litepod-1", 1, 1),
    ("v5litepod-4", 1, 4),
    ("v5litepod-8", 1, 8),
    ("v5litepod-16", 4, 4),
    ("v5litepod-256", 64, 4),
    ("v5p-8", 1, 4),
    ("v5p-16", 2, 4),
    ("v5p-12288", 1536, 4),
    ("v6e-8", 1, 8),
    ("v6e-16", 4, 4),
]


@pytest.mark.parametrize(
    ("accelerator_type", "hosts", "per_host"),
    [row for row in TOPOLOGIES if row[0].split("-")[0] in RUNS],
)
def test_topology_counts_hosts_and_devices_per_host(accelerator_type, hosts, per_host):
    """It knows how many hosts and devices per host an accelerator type has."""
    layout = runtime.topology(accelerator_type)

    assert (layout.hosts, layout.devices_per_host) == (hosts, per_host)
    assert runtime.devices_per_host(accelerator_type) == per_host


def test_baked_accelerator_type_is_in_the_table():
    """It resolves the project's own accelerator type and its default runtime and zone."""
    generation, _ = tpu_generations.parse("{{ cookiecutter.accelerator_type }}")

    assert runtime.topology("{{ cookiecutter.accelerator_type }}").hosts >= 1
    assert "{{ cookiecutter.runtime_version }}" in generation.runtime_versions


def test_every_slice_of_the_table_fills_its_hosts():
    """It lays every offered slice out on whole hosts, each with the same number of chips."""
    for generation in tpu_generations.generations().values():
        if generation.key not in RUNS:
            continue
        for size in generation.slice_sizes:
            layout = runtime.topology(f"{generation.key}-{size}")
            chips = generation.chips(size)
            assert layout.devices == chips * generation.devices_per_chip, (generation.key, size)
            assert layout.hosts == 1 or chips % generation.chips_per_host == 0


@pytest.mark.parametrize(
    ("accelerator_type", "message"),
    [
        ("v5p-3", "'v5p-3' is not a v5p slice: v5p sizes are 8, 16, 32"),
        ("v4-6", "'v4-6' is not a v4 slice"),
        ("v4-08", "'v4-08' is not a v4 slice"),
        ("v5litepod-2", "'v5litepod-2' is not a v5litepod slice"),
        ("v9-8", "unknown accelerator type 'v9-8'"),
        ("v5e-8", "(v5e is v5litepod)"),
        ("v4", "'v4' is not a v4 slice"),
        ("", "unknown accelerator type ''"),
    ],
)
def test_impossible_slices_are_refused(accelerator_type, message):
    """It refuses a size the generation does not offer, or an unknown generation, in one line."""
    with pytest.raises(RuntimeConfigError) as raised:
        runtime.topology(accelerator_type)

    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_peak_flops_come_from_the_generation():
    """It gives the peak bf16 FLOP/s of one chip of the slice's generation."""
    assert runtime.peak_bf16_flops_per_chip("v5p-16") == 459e12
    assert runtime.peak_bf16_flops_per_chip("v5litepod-256") == 197e12
    assert runtime.peak_bf16_flops_per_chip("v4-8") == 275e12


def test_docs_show_the_table():
    """It keeps docs/tpu-generations.md in step with the table: one row and sizes each."""
    text = DOCS.read_text()
    table = json.loads((Path(tpu_generations.__file__).parent / tpu_generations.TABLE).read_text())
    for key, entry in table.items():
        row = re.search(rf"^\| {re.escape(entry['name'])} \| `{key}-N` \|(.*)$", text, re.M)
        assert row, f"no row for {key}"
        cells = [cell.strip() for cell in row.group(1).split("|")]
        assert cells[:6] == [
            str(entry["chips_per_host"]),
            str(entry["single_host_chips"]),
            str(entry["devices_per_chip"]),
            f"{entry['peak_bf16_tflops_per_chip']} TFLOP/s",
            f"{entry['hbm_gib_per_chip']} GiB",
            "yes" if entry["multislice"] else "no",
        ]
        sizes = ", ".join(map(str, entry["slice_sizes"]))
        assert f"- Sizes (N in `{key}-N`): {sizes}\n" in text
        assert f"`{entry['runtime_versions'][0]}`" in text


def make_step(device, rows: int, compiled):
    """A tiny step, run as the backend runs one, whose graph depends only on the batch's row
    count."""
    weight = torch.full((5, 3), 0.5, device=device)
    graph = compiled(lambda: (torch.ones(rows, 5, device=device) @ weight).tanh().sum())

    def step() -> torch.Tensor:
        out = graph()
        ops.sync()
        return out

    return step


def test_guard_passes_when_a_warm_step_repeats(device, compiled):
    """It stays silent when an already-compiled step runs again."""
    step = make_step(device, 11, compiled)
    step()
    step()

    with StepGuard() as guard:
        step()

    assert guard.delta is not None
    assert guard.delta.compilations == 0


def test_guard_flags_a_new_shape_after_warm_up(device, compiled):
    """It raises when a new batch shape compiles a new graph after warm-up."""
    warm = make_step(device, 13, compiled)
    warm()
    warm()

    with pytest.raises(HealthError, match="compiled"), StepGuard():
        make_step(device, 17, compiled)()


def test_guard_flags_a_host_transfer(device, compiled):
    """It raises when `.item()` copies a value of the step to the host inside the block."""
    step = make_step(device, 19, compiled)
    step()
    step()

    with pytest.raises(HealthError, match=TRANSFER), StepGuard():
        compiled(lambda: step().item())()


GLIBC_THRESHOLD = """
import ctypes, json, os, sys
from {{ cookiecutter.package_name }}.core import launcher
if sys.argv[1] == "fixed":
    launcher.give_back_freed_memory()
libc = ctypes.CDLL("libc.so.6")
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.free(ctypes.c_void_p(libc.malloc(4 << 20)))  # freed: glibc raises its threshold to 4 MiB
before = libc.mallinfo2().hblks  # mappings in use
blocks = [libc.malloc(1 << 20) for _ in range(8)]  # 1 MiB each
mapped = libc.mallinfo2().hblks - before
print(json.dumps({"mapped": mapped, "variable": os.environ.get("MALLOC_MMAP_THRESHOLD_")}))
"""


LIBC, LIBC_VERSION = platform.libc_ver()


@pytest.mark.skipif(
    LIBC != "glibc" or tuple(int(part) for part in LIBC_VERSION.split(".")[:2]) < (2, 33),
    reason="glibc's malloc, 2.33 or later (mallinfo2)",
)
def test_a_run_gives_freed_blocks_back_to_the_system(python_subprocess):
    """It fixes glibc's mmap threshold for a run's processes: a block of a MiB is its own
    mapping (given back when freed) even after a larger block was freed, where glibc would
    otherwise serve it from a heap that keeps it."""
    found = {
        case: python_subprocess(["-c", GLIBC_THRESHOLD, case], unset=("MALLOC_MMAP_THRESHOLD_",))
        for case in ("default", "fixed")
    }
    assert found["default"]["mapped"] == 0, found
    assert found["fixed"]["mapped"] >= 8 and found["fixed"]["variable"] == "131072", found
