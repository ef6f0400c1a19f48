"""A real Docker engine for the Docker tier: find or start one, and make a local base image.

No image registry is assumed: the base image is a Debian root file system made with
debootstrap and loaded with `docker import`. It trusts the host's CA certificates and
gets the host's pip index settings, so `pip install` inside a build reaches the same
package index the host does (also behind a TLS-intercepting proxy).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

BASE_IMAGE = "tpu-template-base:bookworm"
BASE_SUITE = "bookworm"
# libpython: torch_xla's extension links against it, and Debian's python3 does not ship it.
BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "libpython3.11", "ca-certificates")
DEBIAN_MIRROR = os.environ.get("TPU_TEMPLATE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
CONFIG_LABEL = "org.tpu-template.base-config"
PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
HOST_LOCAL_CAS = Path("/usr/local/share/ca-certificates")
# Tried in order: overlay2 is fast; vfs works on any file system, only slower.
STORAGE_DRIVERS = ("overlay2", "vfs")


class EngineUnavailable(Exception):
    """No Docker engine can run here; the message says why."""


class CommandFailed(Exception):
    """A command exited non-zero or timed out; the message names the log to read."""


def run_logged(
    command: Sequence[str], log: Path, timeout: float, *, check: bool = True, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    """Run a command, append its command line and output to `log`, and return it."""
    started = time.monotonic()
    with log.open("a", encoding="utf-8") as stream:
        stream.write(f"$ {shlex.join(command)}\n")
        stream.flush()
        try:
            result = subprocess.run(
                list(command),
                stdout=stream,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout,
                check=False,
                **kwargs,  # type: ignore[call-overload]
            )
        except subprocess.TimeoutExpired as error:
            stream.write(f"[timed out after {timeout:.0f}s]\n")
            message = f"{command[0]} timed out after {timeout:.0f}s; see {log}"
            raise CommandFailed(message) from error
        stream.write(f"[exit {result.returncode} after {time.monotonic() - started:.1f}s]\n\n")
    if check and result.returncode != 0:
        raise CommandFailed(f"{shlex.join(command)} exited {result.returncode}; see {log}")
    return result


def _quiet(command: Sequence[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            list(command), capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return subprocess.CompletedProcess(list(command), 1, "", str(error))


@dataclass
class Engine:
    """A reachable Docker engine, and the daemon process when this session started it."""

    docker: str
    log_dir: Path
    daemon: subprocess.Popen[bytes] | None = None
    flags: tuple[str, ...] = ()

    def responds(self) -> bool:
        return _quiet([self.docker, "info"]).returncode == 0

    def image_label(self, image: str, label: str) -> str | None:
        """The image's label value, or None when the image (or label) is absent."""
        template = "{{ index .Config.Labels " + f'"{label}"' + " }}"
        result = _quiet([self.docker, "image", "inspect", "--format", template, image])
        value = result.stdout.strip()
        return value if result.returncode == 0 and value not in ("", "<no value>") else None

    def stop(self) -> None:
        """Stop the daemon if this session started it."""
        if self.daemon is None or self.daemon.poll() is not None:
            return
        self.daemon.terminate()
        try:
            self.daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            self.daemon.wait(timeout=30)


def apt_install(packages: Sequence[str], log: Path) -> None:
    """Install Debian packages (root only), refreshing the package lists first."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run_logged(["apt-get", "update"], log, timeout=600, env=env, stdin=subprocess.DEVNULL)
    run_logged(
        ["apt-get", "install", "-y", "--no-install-recommends", *packages],
        log,
        timeout=1200,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def ensure_engine(log_dir: Path) -> Engine:
    """A responding Docker engine: the running one, or dockerd started here (as root)."""
    docker = shutil.which("docker")
    if docker and _quiet([docker, "info"]).returncode == 0:
        return Engine(docker, log_dir)
    if os.geteuid() != 0:
        raise EngineUnavailable("no Docker engine responds and only root may start one here")
    setup_log = log_dir / "engine-setup.log"
    if not shutil.which("dockerd"):
        try:
            apt_install(["docker.io"], setup_log)
        except CommandFailed as error:
            raise EngineUnavailable(f"cannot install docker.io: {error}") from error
    docker = shutil.which("docker")
    if not docker or not shutil.which("dockerd"):
        raise EngineUnavailable(f"docker.io installed no docker/dockerd on PATH; see {setup_log}")
    if _quiet([docker, "info"]).returncode == 0:  # the package's service started one
        return Engine(docker, log_dir)
    reasons = []
    for driver in STORAGE_DRIVERS:
        engine = _start_dockerd(docker, driver, log_dir)
        if engine.responds():
            return engine
        engine.stop()
        reasons.append(f"{driver}: see {log_dir / f'dockerd-{driver}.log'}")
    raise EngineUnavailable("dockerd did not start (" + "; ".join(reasons) + ")")


def _start_dockerd(docker: str, driver: str, log_dir: Path, wait: float = 90) -> Engine:
    """Start dockerd with flags this kind of kernel accepts and wait until it answers."""
    # No iptables: the tier builds and runs with --network host, and some kernels here
    # lack the netfilter modules the default bridge setup needs.
    flags = (
        "--iptables=false",
        "--ip6tables=false",
        f"--storage-driver={driver}",
        f"--pidfile={log_dir / 'dockerd.pid'}",
    )
    log = (log_dir / f"dockerd-{driver}.log").open("ab")
    daemon = subprocess.Popen(
        ["dockerd", *flags],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    engine = Engine(docker, log_dir, daemon, flags)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and daemon.poll() is None:
        if engine.responds():
            break
        time.sleep(1)
    return engine


def pip_settings() -> dict[str, str]:
    """The host's pip index, timeout and certificate settings that also make sense inside."""
    listed = _quiet([sys.executable, "-m", "pip", "config", "list"]).stdout.splitlines()
    settings: dict[str, str] = {}
    for line in listed:
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        settings[name] = value.strip().strip("'\"")
    for name in ("index-url", "extra-index-url", "trusted-host", "timeout", "default-timeout"):
        env_value = os.environ.get("PIP_" + name.upper().replace("-", "_"))
        if env_value:
            settings[name] = env_value
    kept = {"cert": str(HOST_CA_BUNDLE)}
    for name in ("index-url", "extra-index-url"):
        # file:// indexes and find-links live on the host's disk, not in the image.
        urls = [url for url in settings.get(name, "").split() if url.startswith("http")]
        if urls:
            kept[name] = " ".join(urls)
    if settings.get("trusted-host"):
        kept["trusted-host"] = settings["trusted-host"]
    timeout = settings.get("timeout") or settings.get("default-timeout")
    if timeout:
        kept["timeout"] = timeout
    return kept


def host_index_url() -> str:
    """The package index the host's pip uses (PyPI unless configured otherwise)."""
    configured = os.environ.get("TPU_TEMPLATE_TORCH_INDEX_URL")
    return configured or pip_settings().get("index-url", "https://pypi.org/simple").split()[0]


def proxy_build_args() -> list[str]:
    """--build-arg pairs that pass the host's proxy variables to RUN steps (not the image)."""
    pairs = [f"{name}={os.environ[name]}" for name in PROXY_VARIABLES if os.environ.get(name)]
    return [arg for pair in pairs for arg in ("--build-arg", pair)]


def _host_files() -> dict[str, bytes]:
    """Files copied into the base image: CA certificates and a pip.conf."""
    files = {}
    if HOST_CA_BUNDLE.is_file():
        files[str(HOST_CA_BUNDLE)] = HOST_CA_BUNDLE.read_bytes()
    if HOST_LOCAL_CAS.is_dir():
        for cert in sorted(HOST_LOCAL_CAS.rglob("*.crt")):
            files[str(cert)] = cert.read_bytes()
    pip_conf = "[global]\n" + "".join(f"{k} = {v}\n" for k, v in pip_settings().items())
    files["/etc/pip.conf"] = pip_conf.encode()
    return files


def ensure_base_image(engine: Engine, work_dir: Path, log: Path) -> str:
    """The local Debian base image, rebuilt only when its recipe or the host's CAs change."""
    files = _host_files()
    recipe = hashlib.sha256(repr((BASE_SUITE, BASE_PACKAGES, sorted(files.items()))).encode())
    digest = recipe.hexdigest()[:16]
    if engine.image_label(BASE_IMAGE, CONFIG_LABEL) == digest:
        return BASE_IMAGE
    if not shutil.which("debootstrap"):
        if os.geteuid() != 0:
            raise EngineUnavailable("debootstrap is missing and only root may install it")
        apt_install(["debootstrap"], log)
    root = work_dir / "rootfs"
    shutil.rmtree(root, ignore_errors=True)
    try:
        run_logged(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                BASE_SUITE,
                str(root),
                DEBIAN_MIRROR,
            ],
            log,
            timeout=1800,
            stdin=subprocess.DEVNULL,
        )
        for path, content in files.items():
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (root / cache).glob("*"):
                if entry.is_file():
                    entry.unlink()
        _import_rootfs(engine, root, digest, log)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return BASE_IMAGE


def _import_rootfs(engine: Engine, root: Path, digest: str, log: Path) -> None:
    """Stream the root file system into `docker import`."""
    with log.open("a", encoding="utf-8") as stream:
        stream.write(f"$ tar -C {root} -c . | docker import - {BASE_IMAGE}\n")
    tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
    try:
        run_logged(
            [
                engine.docker,
                "import",
                "--change",
                f"LABEL {CONFIG_LABEL}={digest}",
                "--change",
                "ENV LANG=C.UTF-8",
                "-",
                BASE_IMAGE,
            ],
            log,
            timeout=900,
            stdin=tar.stdout,
        )
    finally:
        if tar.stdout:
            tar.stdout.close()
        if tar.wait(timeout=60) != 0:
            raise CommandFailed(f"tar of {root} failed; see {log}")
