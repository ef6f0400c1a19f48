"""Loading a pretrained Hugging Face model by shards against whole: host RAM, bytes read, time.

    python benchmarks/load_bench.py --make-model DIR [--size 1b|100m|tiny] [--shard-size 500MB]
    python benchmarks/load_bench.py --model DIR --devices 8 --strategy fsdp [--mesh fsdp=8]
                                    --way shards|whole [--gs] [--out runs/load-bench.json]
    python benchmarks/load_bench.py --model DIR --fine-tune 20 --devices 4 --strategy fsdp
                                    [--mesh fsdp=2,tensor=2] [--lora] [--batch-size 1]

`--make-model` writes a Llama in TinyLlama-1.1B's shape (`1b`: hidden 2048, 22 layers, 32
heads, 4 key/value heads, MLP 5632, vocabulary 32000; `100m` and `tiny` are smaller) in bf16
with `save_pretrained(DIR, max_shard_size="500MB")`, and a small byte-level BPE tokenizer
beside it (the task loads the model's tokenizer).

Then, on a layout (`--devices`, `--strategy`, `--mesh`), each process of the run records its
RSS after the imports (the baseline), builds and lays the model out as a run does, and
reports its peak RSS, the bytes of tensor data it read, the seconds to the model laid out,
and the bytes of the model and of its device state. `--way shards`: built on the meta device,
each process reading its devices' shards of the safetensors by byte range; `--way whole`:
`load_decoder` loads it whole on the host first, as every run did before. On XLA:CPU (and
under torch_tpu on the CPU) the devices' buffers live in host RAM: the peak above the
baseline less the device state is what loading cost beside them. `--gs` copies the model to
a bucket of the tests' local GCS server (tests/gcs_emulator.py) and reads it from gs://.
One table row per process, and everything in the `--out` JSON. Not a test: timings move with
whatever else the machine runs.

`--fine-tune STEPS` fine-tunes the model that many steps on the layout twice, read by shards
and loaded whole (tests/test_pretrained_run.py's runs, at the model's size), each in a
process of its own so that neither starts beside what the other left (under torch_xla one
process runs all the devices, and XLA:CPU keeps their buffers in host RAM): each step's two
losses and their relative difference. SGD and `--batch-size 1` by default: the whole-loaded
way holds the model once per process, and a 1B model's AdamW state is 8.8 GB more.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT / "src"))
sys.path.insert(1, str(PROJECT / "tests"))  # the tests' helpers: a tokenizer, a GCS server

MB = 1_000_000
HEADROOM = 512 * MB  # a process's peak above its baseline, beyond its part of the model
READ_SLACK = 1.05  # a process's bytes read, against its part of the files
# Llama shapes: TinyLlama-1.1B's, and smaller ones to try the script with.
SIZES: dict[str, dict[str, Any]] = {
    "1b": {"hidden_size": 2048, "num_hidden_layers": 22, "num_attention_heads": 32,
           "num_key_value_heads": 4, "intermediate_size": 5632, "vocab_size": 32000},
    "100m": {"hidden_size": 768, "num_hidden_layers": 8, "num_attention_heads": 12,
             "num_key_value_heads": 4, "intermediate_size": 2048, "vocab_size": 32000},
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 32000},
}  # fmt: skip
BUCKET = "load-bench"


def make_model(folder: Path, size: str, shard_size: str) -> None:
    """A Llama of `size` in bf16, sharded by `shard_size`, and a small tokenizer for it."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from hf_helpers import train_tokenizer

    tokenizer = train_tokenizer()
    config = LlamaConfig(
        **SIZES[size], max_position_embeddings=2048, rms_norm_eps=1e-5,
        tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
        pad_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder, max_shard_size=shard_size)
    tokenizer.save_pretrained(folder)
    count = sum(p.numel() for p in model.parameters())
    print(f"{folder}: {count / 1e6:.1f}M parameters, {safetensors_bytes(folder) / MB:.1f} MB "
          f"of safetensors in {len(list(folder.glob('*.safetensors')))} file(s)")  # fmt: skip


def safetensors_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.glob("*.safetensors"))


@contextlib.contextmanager
def on_gcs(folder: Path) -> Iterator[str]:
    """The model folder copied to a bucket of a local GCS server, as gs://; the server and
    the variables that point gcsfs at it (for this process and the ones it starts) last
    until the end."""
    from gcs_emulator import GcsEmulator, _start, _stop  # sets what gcsfs needs first

    with tempfile.TemporaryDirectory(prefix="load-bench-gcs-") as scratch:
        process, endpoint = _start(Path(scratch) / "emulator.log")
        os.environ.update({"STORAGE_EMULATOR_HOST": endpoint, "FSSPEC_GS_TOKEN": "anon"})
        try:
            import fsspec

            fsspec.config.conf["gs"] = {"token": "anon"}  # fsspec read FSSPEC_* when imported
            GcsEmulator(endpoint).create_bucket(BUCKET)
            gcs = fsspec.filesystem("gs", token="anon")
            for path in sorted(folder.iterdir()):
                if path.is_file():
                    gcs.put_file(str(path), f"{BUCKET}/model/{path.name}")
            yield f"gs://{BUCKET}/model"
        finally:
            _stop(process)


def status_kb(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS: now; VmHWM: the peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak() -> bool:
    """Start the peak RSS (VmHWM, ru_maxrss) again from the RSS now (Linux: clear_refs 5)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def rss_trimmed() -> int:
    """The RSS (KiB) once glibc has given back the free memory it keeps (malloc_trim): what
    stays above it then is held, not cached by the allocator."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return status_kb("VmRSS")


def tensor_bytes(tensor: Any) -> int:
    return int(tensor.numel()) * int(tensor.element_size())


def model_bytes(model: Any) -> int:
    """The whole model's parameters (a tied one once) and buffers, by their global shapes."""
    return sum(tensor_bytes(t) for t in [*model.parameters(), *model.buffers()])


def device_state_bytes(model: Any, strategy: Any) -> int:
    """What this process's devices hold of the model as laid out: a DTensor's local shard
    (torch_tpu); on torch_xla each addressable device's block (padded) of a parameter by its
    layout, a tensor with none whole on each device; a host tensor as it is."""
    from {{ cookiecutter.package_name }}.core import runtime
    from {{ cookiecutter.package_name }}.core.sharding import shard_shape

    specs = getattr(strategy, "specs", {})  # torch_xla spmd: id(parameter) -> its layout
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        local = getattr(tensor, "to_local", None)
        if callable(local):
            total += tensor_bytes(local())
        elif tensor.device.type == "xla":
            spec = specs.get(id(tensor))
            shape = tensor.shape if spec is None else shard_shape(
                tensor.shape, spec, strategy.mesh_axes())  # fmt: skip
            devices = runtime.addressable_device_count()
            total += math.prod(shape) * tensor.element_size() * devices
        else:
            total += tensor_bytes(tensor)
    return total


def settle(model: Any) -> None:
    """Wait until every device transfer is done (torch_xla runs them asynchronously)."""
    if any(p.device.type == "xla" for p in model.parameters()):
        import torch_xla
        import torch_xla.core.xla_model as xm

        torch_xla.sync()
        xm.wait_device_ops()


def measure(config: Any, way: str, model_type: str, file_bytes: int, results: str) -> None:
    """In each process of the run: the baseline after the imports, then the model built and
    laid out as a run does; the figures go to `results`/process-N.json."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401  (in the baseline)

    from {{ cookiecutter.package_name }}.core import runtime
    from {{ cookiecutter.package_name }}.hf.models import load_decoder
    from {{ cookiecutter.package_name }}.tasks import block_class, load_task
    from {{ cookiecutter.package_name }}.training import plan_of
    from {{ cookiecutter.package_name }}.training.model import build, sharding_rules

    with contextlib.suppress(ImportError):  # the model's module, as transformers loads it
        importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    location = config.task_options["model_name"]
    strategy = plan_of(config).strategy
    baseline = status_kb("VmRSS")
    reset = reset_peak()
    started = time.perf_counter()
    task = load_task(config.task, config.data, config.task_options)
    built = build(task, config, model=load_decoder(location) if way == "whole" else None)
    rules = sharding_rules(task, built.model, config, strategy)
    model, _ = strategy.setup_model(
        built.model, block_class(task, built.model), False, rules, built.source
    )
    settle(model)
    seconds = time.perf_counter() - started
    peak, after = status_kb("VmHWM"), status_kb("VmRSS")
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    trimmed = rss_trimmed()
    pretrained = getattr(built.source, "pretrained", None)
    record = {
        "process": runtime.process_index(),
        "processes": runtime.process_count(),
        "devices": runtime.addressable_device_count(),
        "way": way,
        "built_on_meta": built.source is not None,
        "note": built.note,
        "baseline_bytes": baseline * 1024,
        "peak_bytes": peak * 1024,
        "ru_maxrss_bytes": maxrss * 1024,
        "rss_after_bytes": after * 1024,
        "rss_after_malloc_trim_bytes": trimmed * 1024,
        "peak_reset": reset,
        "bytes_read": pretrained.bytes_read if pretrained is not None else file_bytes,
        "bytes_read_counted": pretrained is not None,
        "seconds": seconds,
        "model_bytes": model_bytes(model),
        "device_state_bytes": device_state_bytes(model, strategy),
    }
    Path(results, f"process-{record['process']}.json").write_text(json.dumps(record))


def rows(records: list[dict[str, Any]], file_bytes: int) -> list[str]:
    """The markdown table: one row per process."""
    lines = [
        "| process | baseline MB | peak above baseline MB | bound MB | device state MB | "
        "above baseline less device MB | read MB | read bound MB | seconds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in records:
        above = r["peak_bytes"] - r["baseline_bytes"]
        shards = r["way"] == "shards"
        bound = f"{(r['model_bytes'] / r['processes'] + HEADROOM) / MB:.0f}" if shards else "-"
        read_bound = f"{file_bytes / r['processes'] * READ_SLACK / MB:.1f}" if shards else "-"
        lines.append(
            f"| {r['process']} | {r['baseline_bytes'] / MB:.0f} | {above / MB:.0f} | {bound} | "
            f"{r['device_state_bytes'] / MB:.0f} | {(above - r['device_state_bytes']) / MB:.0f} | "
            f"{r['bytes_read'] / MB:.1f} | {read_bound} | {r['seconds']:.1f} |"
        )
    return lines


def run(args: argparse.Namespace) -> None:
    from {{ cookiecutter.package_name }}.core import Precision, launch
    from {{ cookiecutter.package_name }}.training import build_config, plan_of

    folder = args.model.resolve()
    file_bytes = safetensors_bytes(folder)
    if not file_bytes:
        raise SystemExit(f"{folder} holds no safetensors: write one with --make-model")
    if args.gs and args.way == "whole":
        raise SystemExit("--way whole loads with transformers' from_pretrained, from a local "
                         "folder or the Hugging Face cache only: drop --gs")  # fmt: skip
    model_type = json.loads((folder / "config.json").read_text()).get("model_type", "")
    with contextlib.ExitStack() as stack:
        location = stack.enter_context(on_gcs(folder)) if args.gs else str(folder)
        settings = {
            "task": "hf-causal-lm", "accelerator": "cpu", "goodput": "off",
            "task_options": {"model_name": location, "seq_len": 16, "max_bytes": 20_000},
            "devices": str(args.devices), "strategy": args.strategy, "mesh": args.mesh,
            "precision": args.precision,
        }  # fmt: skip
        config = build_config(None, settings)
        plan = plan_of(config)
        Precision.from_name(config.precision).apply_environment()  # as `train` does
        results = stack.enter_context(tempfile.TemporaryDirectory(prefix="load-bench-"))
        launch(measure, plan, (config, args.way, model_type, file_bytes, results))
        records = sorted((json.loads(p.read_text()) for p in Path(results).glob("*.json")),
                         key=lambda r: r["process"])  # fmt: skip
    model = records[0]["model_bytes"]
    title = (f"{args.way}: {location}, {args.strategy} x{args.devices}"
             f"{f' ({args.mesh})' if args.mesh else ''}, {args.precision}, model "
             f"{model / MB:.0f} MB, safetensors {file_bytes / MB:.0f} MB, "
             f"{records[0]['processes']} process(es)")  # fmt: skip
    table = rows(records, file_bytes)
    print("\n".join([title, *table]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    summary = {"title": title, "model": str(folder), "location": location, "way": args.way,
               "devices": args.devices, "strategy": args.strategy, "mesh": args.mesh,
               "precision": args.precision, "safetensors_bytes": file_bytes,
               "headroom_bytes": HEADROOM, "read_slack": READ_SLACK, "table": table,
               "processes": records}  # fmt: skip
    args.out.write_text(json.dumps(summary, indent=2) + "\n")


def fine_tune_one_way(args: argparse.Namespace) -> None:
    from hf_helpers import pretrained_losses

    ways = pretrained_losses(str(args.model.resolve()), str(args.devices), args.strategy,
                             args.mesh, args.lora, args.fine_tune, ways=(args.fine_tune_way,),
                             precision=args.precision, optimizer=args.optimizer,
                             batch_size=args.batch_size)  # fmt: skip
    args.out.write_text(json.dumps(ways))


def fine_tune(args: argparse.Namespace) -> None:
    folder = str(args.model.resolve())
    ways: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="load-bench-") as results:
        for way in ("by shards", "whole"):
            out = Path(results) / "way.json"
            command = [sys.executable, __file__, *sys.argv[1:], "--fine-tune-way", way,
                       "--out", str(out)]  # fmt: skip
            if code := subprocess.run(command, check=False).returncode:
                raise SystemExit(f"the fine-tuning {way} exited with {code}")
            ways |= json.loads(out.read_text())
    shards, whole = ways["by shards"]["losses"], ways["whole"]["losses"]
    differences = [abs(a - b) / abs(b) for a, b in zip(shards, whole, strict=True)]
    title = (f"fine-tuning {folder}, {args.strategy} x{args.devices}"
             f"{f' ({args.mesh})' if args.mesh else ''}{', LoRA' if args.lora else ''}, "
             f"{args.precision}, {args.optimizer}, batch {args.batch_size} per device: "
             f"largest relative difference {max(differences):.2e}")  # fmt: skip
    steps = enumerate(zip(shards, whole, differences, strict=True), 1)
    table = ["| step | read by shards | loaded whole | relative difference |",
             "| --- | --- | --- | --- |",
             *(f"| {n} | {a:.6f} | {b:.6f} | {d:.2e} |" for n, (a, b, d) in steps)]  # fmt: skip
    print("\n".join([title, *table]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"title": title, "runs": ways, "table": table}, indent=2))


def parser() -> argparse.ArgumentParser:
    """The command line this script takes (the docs' commands are checked against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--make-model", type=Path, metavar="DIR", help="Write a model there.")
    parser.add_argument("--size", choices=sorted(SIZES), default="1b")
    parser.add_argument("--shard-size", default="500MB", help="save_pretrained's max_shard_size.")
    parser.add_argument("--model", type=Path, metavar="DIR", help="The model to load.")
    parser.add_argument("--gs", action="store_true", help="Read it from gs:// (local server).")
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--strategy", default="fsdp", help="fsdp, single, ...")
    parser.add_argument("--mesh", default="")
    parser.add_argument("--way", choices=("shards", "whole"), default="shards")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--out", type=Path, default=Path("runs/load-bench.json"))
    parser.add_argument("--fine-tune", type=int, default=0, metavar="STEPS",
                        help="Fine-tune it read by shards and loaded whole.")  # fmt: skip
    parser.add_argument("--lora", action="store_true", help="With --fine-tune: LoRA.")
    parser.add_argument("--optimizer", default="sgd", help="With --fine-tune.")
    parser.add_argument("--batch-size", type=int, default=1, help="With --fine-tune.")
    parser.add_argument("--fine-tune-way", choices=("by shards", "whole"), help=argparse.SUPPRESS)
    return parser


def main() -> None:
    command_line = parser()
    args = command_line.parse_args()
    if args.make_model and not args.fine_tune_way:
        make_model(args.make_model, args.size, args.shard_size)
    if args.fine_tune_way:  # one of --fine-tune's two runs, in its own process
        fine_tune_one_way(args)
    elif args.model and args.fine_tune:
        fine_tune(args)
    elif args.model:
        run(args)
    elif not args.make_model:
        command_line.error("give --make-model DIR, --model DIR, or both")


if __name__ == "__main__":
    main()
