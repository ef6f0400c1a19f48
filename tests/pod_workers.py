"""The workers of TPU pod slices, on this machine, behind a real sshd each.

Worker I listens on 127.0.0.(I+2):22, the address the TPU API stand-in gives as its
network endpoint, with a host key of its own. Several slices of H hosts each are
consecutive runs of workers: slice S is workers S*H ... S*H+H-1. Every session (gcloud's
ssh, scp over SFTP, and the startup script at boot) runs through `worker-shell`, the sshd
ForceCommand: it enters a private mount namespace in which the worker has its own
/home, /opt, /var/log, /var/lib, /var/cache and /tmp (its home is /home/worker), so
workers share no project copy, virtual environment, startup log, marker or libtpu
lockfile, as separate TPU VMs would.
TPU_WORKER_ID is set as on a TPU VM: the worker's index within its slice; its slice's
addresses, which a TPU VM's metadata server gives, are TPU_WORKER_HOSTNAMES. Needs root
(port 22, mount namespaces) and openssh-server, which is installed from Debian's packages
when missing.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from docker_engine import CommandFailed, apt_install

SSH_PORT = 22  # gcloud connects to port 22 of each worker's address
# Bound over the machine's own in this order; /tmp last, as the workers' folders are in it.
PRIVATE_DIRS = ("home", "opt", "var/log", "var/lib", "var/cache", "tmp")
HOME = "/home/worker"
SHARED_LIST = "shared-paths"  # the paths of this machine every worker sees in place
SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server")
LOGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

WORKER_SHELL = r"""#!/bin/bash
# The login shell of one worker (sshd's ForceCommand; also runs its startup script).
# Arguments: the worker's folder, its index in its slice, the sftp-server to start for SFTP,
# its slice's worker addresses (comma-separated).
set -eu
root="$1" worker="$2" sftp_server="$3"
command="${SSH_ORIGINAL_COMMAND:-}"
export HOME="__HOME__" TPU_WORKER_ID="$worker" TPU_WORKER_HOSTNAMES="$4"
export USER=root LOGNAME=root SHELL=/bin/bash
export PATH="__LOGIN_PATH__"
# pip on a worker uses what the worker has: no index, no configuration of this machine.
export PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 PIP_NO_BUILD_ISOLATION=0
# Paths of this machine the worker sees in place although they lie in its own directories
# (the runtime its image stands for): bound into the worker's folder, which is then bound
# over the machine's directories with what is mounted in it (`Pod.share` adds to them).
mapfile -t shared < "__SHARED__"
exec unshare --mount --propagation private -- /bin/bash -c '
    set -eu
    for path in "${@:4}"; do mkdir -p "$1$path"; mount --bind "$path" "$1$path"; done
    for dir in __PRIVATE_DIRS__; do mount --rbind "$1/$dir" "/$dir"; done
    cd "$HOME"
    if [ -z "$2" ]; then exec bash -l; fi
    if [ "$2" = "$3" ]; then exec "$3"; fi
    exec bash -c "$2"' worker-shell "$root" "$command" "$sftp_server" "${shared[@]}"
"""

SSHD_CONFIG = """\
Port {port}
ListenAddress {address}
HostKey {host_key}
PidFile {folder}/sshd.pid
AuthorizedKeysFile {authorized_keys}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
MaxStartups 100
LogLevel VERBOSE
Subsystem sftp {sftp_server}
ForceCommand {shell} {folder} {index} {sftp_server} {hostnames}
"""


class WorkersUnavailable(Exception):
    """Workers cannot run on this machine; the message says why."""


def ensure_sshd(log: Path) -> tuple[str, str]:
    """sshd and sftp-server, installed from Debian's openssh-server when missing (root)."""

    def found() -> tuple[str, str] | None:
        sshd = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else "")
        sftp = next((path for path in SFTP_SERVERS if Path(path).exists()), "")
        return (sshd, sftp) if sshd and sftp else None

    programs = found()
    if programs:
        return programs
    if os.geteuid() != 0:
        raise WorkersUnavailable("sshd is not installed and only root may install it here")
    try:
        apt_install(["openssh-server"], log)
    except CommandFailed as error:
        raise WorkersUnavailable(f"cannot install openssh-server: {error}") from error
    programs = found()
    if not programs:
        raise WorkersUnavailable(f"openssh-server installed no sshd/sftp-server; see {log}")
    return programs


def check_can_host(addresses: Sequence[str]) -> None:
    """Raise WorkersUnavailable unless this process may bind port 22 and make namespaces."""
    if os.geteuid() != 0:
        raise WorkersUnavailable("workers need root (port 22 and mount namespaces)")
    for address in addresses:
        with socket.socket() as probe:
            # As sshd does: connections of an earlier run in TIME_WAIT do not block it.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((address, SSH_PORT))
            except OSError as error:
                raise WorkersUnavailable(
                    f"cannot listen on {address}:{SSH_PORT} ({error.strerror}): "
                    "is an sshd already listening on every address?"
                ) from None
    trial = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if trial.returncode != 0:
        raise WorkersUnavailable(f"no mount namespaces here: {trial.stderr.strip()}")


@dataclass
class Worker:
    """One worker: its index, address, folder and sshd host key, and its place in its slice."""

    index: int
    address: str
    folder: Path
    host_key: str  # "ssh-ed25519 AAAA...", as the guest attribute carries it
    slice: int = 0
    worker_id: int = 0  # TPU_WORKER_ID: the index within its slice
    hostnames: str = ""  # TPU_WORKER_HOSTNAMES: its slice's worker addresses

    @property
    def home(self) -> Path:
        """The worker's home directory, as seen from this machine."""
        return self.path(HOME)

    def path(self, inside: str) -> Path:
        """Where a path of the worker's private file system lies on this machine."""
        for private in PRIVATE_DIRS:
            prefix = f"/{private}/"
            if inside.startswith(prefix):
                return self.folder / private / inside[len(prefix) :]
        raise ValueError(f"{inside} is not in the worker's own directories")


@dataclass
class Pod:
    """Running workers and their sshds."""

    base: Path
    workers: list[Worker]
    authorized_keys: Path
    shell: Path
    sftp_server: str
    sshds: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def run(
        self,
        worker: int,
        command: str,
        env: Mapping[str, str] | None = None,
        timeout: float = 600,
    ) -> subprocess.CompletedProcess[str]:
        """Run a shell command in worker `worker` as its login shell would."""
        target = self.workers[worker]
        environment = {"SSH_ORIGINAL_COMMAND": command, "PATH": LOGIN_PATH, **(env or {})}
        shell = [str(self.shell), str(target.folder), str(target.worker_id), self.sftp_server]
        return subprocess.run(
            [*shell, target.hostnames],
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def boot(self, worker: int, script: str, env: Mapping[str, str]) -> None:
        """Run a startup script on a worker as root, as a TPU VM does at boot."""
        folder = self.workers[worker].folder
        self.workers[worker].path("/tmp/startup-script").write_text(script, encoding="utf-8")
        result = self.run(worker, "bash /tmp/startup-script", env)
        (folder / "boot.log").write_text(
            f"[exit {result.returncode}]\n{result.stdout}{result.stderr}", encoding="utf-8"
        )

    def share(self, paths: Sequence[Path]) -> None:
        """Let every worker see these paths of this machine in place from its next session on,
        even where they lie in one of its own directories."""
        with (self.base / SHARED_LIST).open("a", encoding="utf-8") as listed:
            listed.writelines(f"{path}\n" for path in _hidden(paths))

    def stop(self) -> None:
        for sshd in self.sshds:
            if sshd.poll() is None:
                sshd.terminate()
        for sshd in self.sshds:
            try:
                sshd.wait(timeout=10)
            except subprocess.TimeoutExpired:
                sshd.kill()


def _hidden(paths: Sequence[Path]) -> list[Path]:
    """The paths a worker's own directories would hide."""
    resolved = [path.resolve() for path in paths]
    return [path for path in resolved if any(path.is_relative_to(f"/{d}") for d in PRIVATE_DIRS)]


def _host_key(folder: Path) -> str:
    key = folder / "ssh_host_ed25519_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(key)],
        check=True,
        capture_output=True,
    )
    return " ".join(key.with_suffix(".pub").read_text(encoding="ascii").split()[:2])


def _wait_listening(address: str, deadline: float) -> bool:
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            probe.settimeout(0.5)
            if probe.connect_ex((address, SSH_PORT)) == 0:
                return True
        time.sleep(0.1)
    return False


def start_pod(base: Path, count: int, shared: Sequence[Path] = (), hosts_per_slice: int = 0) -> Pod:
    """Start `count` workers under `base`, each with its sshd on 127.0.0.(I+2):22.

    `shared`: directories of this machine every worker sees at the same path, even where
    that path lies in one of the worker's own directories (a virtual environment in /tmp).
    `hosts_per_slice`: workers of each slice (default: all in one slice).
    """
    per_slice = hosts_per_slice or count
    base.mkdir(parents=True, exist_ok=True)
    sshd, sftp_server = ensure_sshd(base / "sshd-install.log")
    addresses = [f"127.0.0.{index + 2}" for index in range(count)]
    check_can_host(addresses)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    shell = base / "worker-shell"
    shell.write_text(
        WORKER_SHELL.replace("__LOGIN_PATH__", LOGIN_PATH)
        .replace("__PRIVATE_DIRS__", " ".join(PRIVATE_DIRS))
        .replace("__HOME__", HOME)
        .replace("__SHARED__", shlex.quote(str(base / SHARED_LIST))),
        encoding="utf-8",
    )
    shell.chmod(0o755)
    (base / SHARED_LIST).write_text("", encoding="utf-8")
    authorized_keys = base / "authorized_keys"
    authorized_keys.touch()
    pod = Pod(base, [], authorized_keys, shell, sftp_server)
    pod.share(shared)
    try:
        for index, address in enumerate(addresses):
            folder = base / f"worker-{index}"
            for private in PRIVATE_DIRS:
                (folder / private).mkdir(parents=True, exist_ok=True)
            (folder / HOME.lstrip("/")).mkdir()
            slice_index, worker_id = divmod(index, per_slice)
            first = slice_index * per_slice
            hostnames = ",".join(addresses[first : first + per_slice])
            worker = Worker(
                index, address, folder, _host_key(folder), slice_index, worker_id, hostnames
            )
            config = folder / "sshd_config"
            config.write_text(
                SSHD_CONFIG.format(
                    port=SSH_PORT,
                    address=address,
                    host_key=folder / "ssh_host_ed25519_key",
                    folder=folder,
                    authorized_keys=authorized_keys,
                    sftp_server=sftp_server,
                    shell=shell,
                    index=worker_id,
                    hostnames=hostnames,
                ),
                encoding="utf-8",
            )
            log = (folder / "sshd.log").open("ab")
            pod.sshds.append(
                subprocess.Popen(
                    [sshd, "-D", "-e", "-f", str(config)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
            pod.workers.append(worker)
        deadline = time.monotonic() + 20
        for worker, process in zip(pod.workers, pod.sshds, strict=True):
            if not _wait_listening(worker.address, deadline) or process.poll() is not None:
                log_text = (worker.folder / "sshd.log").read_text(errors="replace")
                raise WorkersUnavailable(f"sshd of worker {worker.index} did not start: {log_text}")
    except BaseException:
        pod.stop()
        raise
    return pod
