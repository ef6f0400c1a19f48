"""Host RAM per host while a run loads its model and while it exports it, beside HBM per device.

No host holds the whole model. A run builds it on the meta device, lays it out over the mesh
and materializes only each device's shards: initialized one module at a time on the host (its
tensors whole, then the local shards kept), or read from pretrained safetensors by byte range,
one tensor at a time (a tensor a weight converter makes, a mixture's stacked experts, is read
whole from its sources); the shards go to HBM. Export writes Hugging Face safetensors tensor by
tensor from one process. So:

    loading, per host = processes on the host x (a process's baseline
                            + the largest tensor, whole, in the dtype it is read in
                            + that tensor converted, when the parameter's dtype differs)
                        + the host's part of the model kept in host memory (none on a TPU)
    exporting, one process = a process's baseline + the largest tensor twice (gathered in the
                             parameter's dtype, and converted to the dtype written)
                             + the writer's buffers

The processes on a host are the backend's: one under torch_xla (it drives every device of
the host), one per device under torch_tpu; `plan` reports for the backend this project is
built on. The dtype read is a pretrained decoder's checkpoint dtype (`workload.py`); a model
a run initializes is made in its own dtype, so nothing is converted. A converted tensor holds
its sources too while it is made. The largest tensor is the one whose reading costs most.

A process's baseline is measured, not derived: the peak resident memory of a process with
torch and this package imported and the runtime started (`torch_xla.device()` and one op on
XLA:CPU; a one-process gloo group on the CPU for torch_tpu), plus what importing transformers
and peft adds for a Hugging Face model, on a 2-core x86 machine. They are figures from
XLA:CPU and the CPU.

Left out: on a TPU VM, libtpu and the TPU runtime's own host memory (the figures above come
from XLA:CPU/CPU, without them); the operating system, the page cache and other programs;
a data loader's workers and prefetched batches; the compiler's memory; each device's shards
staged on their way to HBM beside the whole tensor; a checkpoint's async copies. The verdict
compares the total with the RAM of the slice's hosts (their VMs', by their chips) less the
same share `--margin` keeps free of HBM; a generation whose host RAM Google's pages do not
give has no verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core import tpu_generations
from .estimate import Accelerator
from .workload import Workload

MIB = 2**20
# A process's peak resident memory with torch and the package imported and the runtime started,
# measured on XLA:CPU (torch_xla 2.9) and the CPU (torch 2.13, gloo) as the docstring says.
BASELINE_BYTES = {"torch_xla": 878 * MIB, "torch_tpu": 226 * MIB}
# What importing transformers, peft and a decoder's modeling code adds to it (transformers 5).
HUGGING_FACE_BYTES = 186 * MIB
# What the export's writer may hold before its bytes reach the file or the bucket.
WRITE_BUFFER_BYTES = 64 * MIB


def processes_per_host(accelerator: Accelerator, backend: str = tpu_generations.BACKEND) -> int:
    """The processes a run starts on each host: torch_xla's one, or torch_tpu's one per device."""
    if backend == "torch_tpu":
        return accelerator.generation.devices_per_host(accelerator.size)
    return 1


@dataclass(frozen=True)
class Tensor:
    """The tensor whose reading (or writing) holds the most host memory, and what it holds."""

    name: str
    shape: tuple[int, ...]
    read: int  # whole, in the dtype read (a converted tensor's sources too)
    converted: int  # its copy in the other dtype, 0 when none is made


@dataclass(frozen=True)
class HostMemory:
    """Bytes on each host of a slice while a run loads its model, and while it exports it."""

    backend: str
    hosts: int
    processes: int  # per host
    baseline: int  # one process
    loaded: Tensor
    resident: int  # the host's part of the model kept in host memory: none, it goes to HBM
    exported: Tensor
    write_buffers: int
    host_bytes: int | None  # each host's RAM (its VM's); None: Google's pages give none
    margin: float

    @property
    def loading(self) -> int:
        per_process = self.baseline + self.loaded.read + self.loaded.converted
        return self.processes * per_process + self.resident

    @property
    def exporting(self) -> int:
        return self.baseline + self.exported.read + self.exported.converted + self.write_buffers

    @property
    def usable_bytes(self) -> int | None:
        """The host's RAM less the margin, as the HBM verdict keeps it."""
        return None if self.host_bytes is None else int(self.host_bytes * (1 - self.margin))

    def fits(self, needed: int) -> bool | None:
        """Whether `needed` bytes fit a host; None when its RAM is unknown."""
        usable = self.usable_bytes
        return None if usable is None else needed <= usable

    @property
    def loadable(self) -> bool | None:
        return self.fits(self.loading)

    @property
    def exportable(self) -> bool | None:
        return self.fits(self.exporting)


def host_memory(
    workload: Workload, accelerator: Accelerator, margin: float,
    backend: str = tpu_generations.BACKEND,
) -> HostMemory:  # fmt: skip
    """The host RAM a run of `workload` needs on each host of `accelerator`."""
    generation, size = accelerator.generation, accelerator.size
    baseline = BASELINE_BYTES[backend] + (HUGGING_FACE_BYTES if workload.hugging_face else 0)
    return HostMemory(
        backend=backend,
        hosts=generation.hosts(size),
        processes=processes_per_host(accelerator, backend),
        baseline=baseline,
        loaded=_largest(workload, loading=True),
        resident=0,
        exported=_largest(workload, loading=False),
        write_buffers=WRITE_BUFFER_BYTES,
        host_bytes=generation.host_ram_bytes(size),
        margin=margin,
    )


def _largest(workload: Workload, loading: bool) -> Tensor:
    """The parameter that costs most to load (read, its sources, converted) or to export
    (gathered, then converted to the dtype written: the checkpoint's, else its own)."""
    found = Tensor("", (), 0, 0)
    for index, param in enumerate(workload.parameters):
        elements = 1
        for dim in param.shape:
            elements *= dim
        stored = workload.checkpoint_itemsize or param.itemsize
        if loading:
            sources = 2 if index in workload.converted else 1
            read = elements * stored * sources
            converted = elements * param.itemsize if stored != param.itemsize else 0
        else:
            read, converted = elements * param.itemsize, elements * stored
        if read + converted > found.read + found.converted:
            found = Tensor(param.names[0], param.shape, read, converted)
    return found
