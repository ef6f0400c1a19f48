"""Training from a prepared dataset on gs:// read in place: steps/s, bytes fetched, memory, disk.

    python benchmarks/read_bench.py [--delay-ms 50] [--steps 400] [--seq-len 1024]
                                    [--megabytes 4] [--out runs/read-bench]

Starts the local GCS emulator of the tests behind a proxy that holds every request for
`--delay-ms` and counts what it relays; prepares a corpus of `--megabytes` and one ten times
larger into it; then trains the example (each run its own process, `HOME` and `TMPDIR`
fresh folders) from a local copy and from gs://. It reports steps/s, the payload the reader
asked for (the Range requests) and the bytes on the wire against the windows the steps
trained on, the peak RSS, and the local disk written. Not a test: timings move with
whatever else the machine runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import socketserver
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[1]
PACKAGE = "{{ cookiecutter.package_name }}"
RANGE = re.compile(rb"\r\nrange: bytes=(\d+)-(\d+)", re.I)


class Proxy(socketserver.ThreadingTCPServer):
    """A TCP relay to the emulator that delays each connection (one request: the emulator
    speaks HTTP/1.0) and counts requests, ranged payload and bytes relayed."""

    daemon_threads = True
    request_queue_size = 512

    def __init__(self, upstream: int, delay: float) -> None:
        self.upstream, self.delay = upstream, delay
        self.lock = threading.Lock()
        self.requests = self.ranged = self.wire = 0
        super().__init__(("127.0.0.1", 0), Relay)

    def count(self, requests: int = 0, ranged: int = 0, wire: int = 0) -> None:
        with self.lock:
            self.requests += requests
            self.ranged += ranged
            self.wire += wire


class Relay(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: Any = self.server
        time.sleep(server.delay)
        upstream = socket.create_connection(("127.0.0.1", server.upstream))
        first = self.request.recv(65536)
        server.count(1, sum(int(b) - int(a) + 1 for a, b in RANGE.findall(first)), len(first))
        upstream.sendall(first)
        sending = threading.Thread(target=self._pipe, args=(self.request, upstream, server))
        sending.start()
        self._pipe(upstream, self.request, server)
        sending.join()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket, server: Any) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
                server.count(wire=len(data))
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)


def start_emulator(folder: Path) -> tuple[subprocess.Popen[bytes], int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, str(PROJECT / "tests" / "gcs_emulator.py"), "start", "--host",
               "127.0.0.1", "--port", str(port), "--in-memory", "--quiet"]  # fmt: skip
    emulator = subprocess.Popen(command, stdout=(folder / "emulator.log").open("wb"),
                                stderr=subprocess.STDOUT)  # fmt: skip
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/storage/v1/b?project=bench",
        data=json.dumps({"name": "bench"}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    urllib.request.urlopen(request, timeout=10)
    return emulator, port


def environment(endpoint: str, home: Path) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    (home / "tmp").mkdir(exist_ok=True)
    return {
        **os.environ,
        "PYTHONPATH": str(PROJECT / "src"),
        "PJRT_DEVICE": "CPU",
        "STORAGE_EMULATOR_HOST": endpoint,
        "FSSPEC_GS_TOKEN": "anon",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "HOME": str(home),
        "TMPDIR": str(home / "tmp"),
    }


def corpus(path: Path, megabytes: int) -> Path:
    sys.path.insert(0, str(PROJECT / "src"))
    from {{ cookiecutter.package_name }}.tasks._corpus import stdlib_corpus

    text = stdlib_corpus(4 << 20).decode(errors="replace").split("\n\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        size = 0
        while size < megabytes << 20:
            for block in text:
                size += out.write(json.dumps({"text": block}) + "\n")
    return path


def run(command: list[str], env: dict[str, str]) -> tuple[int, int]:
    """Run a command to its end; its exit code and peak RSS (KiB)."""
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    if status:
        raise SystemExit(f"{' '.join(command)} failed:\n{process.stderr.read().decode()[-3000:]}")  # type: ignore[union-attr]
    return status, usage.ru_maxrss


def disk(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def parser() -> argparse.ArgumentParser:
    """The command line this script takes (the docs' commands are checked against it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--megabytes", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("runs/read-bench"))
    parser.add_argument(
        "--model", nargs="*", default=["dim=32", "layers=1", "heads=2"],
        help="task_options of the model: small, so the step is short and waits would show",
    )  # fmt: skip
    return parser


def main() -> None:
    args = parser().parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    emulator, port = start_emulator(args.out)
    proxy = Proxy(port, args.delay_ms / 1000)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    cli = [sys.executable, "-m", PACKAGE]
    options = ["--set", f"task_options.seq_len={args.seq_len}"]
    model = [item for pair in args.model for item in ("--set", f"task_options.{pair}")]
    direct = environment(f"http://127.0.0.1:{port}", args.out / "home-prepare")
    try:
        for scale in (1, 10):
            source = corpus(args.out / f"corpus-{scale}x.jsonl", args.megabytes * scale)
            run([*cli, "prepare", str(source), "--out", f"gs://bench/prepared-{scale}x",
                 "--eval-fraction", "0.002", *options], direct)  # fmt: skip
        local = args.out / "local-1x"
        run([sys.executable, "-c", "import fsspec, sys; fsspec.filesystem('gs').get("
             "'bench/prepared-1x', sys.argv[1], recursive=True)", str(local)], direct)  # fmt: skip
        rows = []
        # A window's bytes: each per-token column it carries (ids, and the positions that
        # mark where documents start), 4 bytes a token.
        index = json.loads((local / "train" / "index.json").read_text())
        columns = list(index["files"][0]["chunks"][0]["at"])
        window = (args.seq_len + 1) * 4 * len(columns)
        for name, data in (("local 1x", str(local)), ("gs:// 1x", "gs://bench/prepared-1x"),
                           ("gs:// 10x", "gs://bench/prepared-10x")):  # fmt: skip
            home = args.out / f"home-{len(rows)}"
            env = environment(f"http://127.0.0.1:{proxy.server_address[1]}", home)
            before = (proxy.requests, proxy.ranged, proxy.wire)
            run_dir = args.out / f"run-{len(rows)}"
            _, rss = run([*cli, "train", "--config", "configs/lm.toml", "--data", data,
                          "--max-steps", str(args.steps), "--log-every", str(args.steps),
                          "--eval-every", "0", "--run-dir", str(run_dir), "--batch-size",
                          str(args.batch_size), *options, *model], env)  # fmt: skip
            summary = json.loads((run_dir / "summary.json").read_text())
            requests, ranged, wire = (now - then for now, then in zip(
                (proxy.requests, proxy.ranged, proxy.wire), before, strict=True))  # fmt: skip
            trained = args.steps * args.batch_size * window
            rows.append((name, summary["steps_per_second"], requests, ranged / trained,
                         wire / trained, rss / 1024, disk(home)))  # fmt: skip
    finally:
        proxy.shutdown()
        emulator.terminate()
        emulator.wait()
    lines = [
        f"{args.steps} steps of batch {args.batch_size}, windows of {args.seq_len + 1} tokens "
        f"({', '.join(columns)}: {window:,} bytes), {args.delay_ms:.0f} ms added to each "
        "gs:// request",
        "| data | steps/s | requests | asked / trained | wire / trained | peak RSS MiB | "
        "local disk bytes |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, rate, requests, asked, wire, rss, written in rows:
        lines.append(f"| {name} | {rate:.2f} | {requests} | {asked:.2f}x | {wire:.2f}x | "
                     f"{rss:.0f} | {written:,} |")  # fmt: skip
    print("\n".join(lines))
    (args.out / "read-bench.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
