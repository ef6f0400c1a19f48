"""The pod launcher: one command on every worker of every slice of a TPU, through gcloud.

- `target`: the TPU (name, zone, project, gcloud) and its workers' count and addresses;
- `slices`: the node of each slice (NAME, or NAME-0 ... NAME-(N-1)) and every worker of
  every slice;
- `commands`: the shell lines the workers run, and the shell files shipped with them
  (`kill.sh` frees the TPU, `status.sh` reads the startup script's progress);
- `fanout`: one ssh or scp per worker, all at once, output prefixed, fail-fast;
- `defaults`: the baked zone, project and TPU, and where the project lives on a worker;
- `launch` and `cli`: the `pod run|sync|train|kill|status|nodes` commands, and each
  worker's environment (with several slices, the multislice variables of its slice).

Nothing here imports torch_xla.
"""

from __future__ import annotations

from .commands import (
    DEVICE_PATTERNS,
    DOCKER_RUN_FLAGS,
    FORWARDED_PREFIXES,
    KILL_SCRIPT,
    LIBTPU_LOCKFILE,
    NOT_FORWARDED,
    STATUS_SCRIPT,
    docker_command,
    forwarded_env,
    install_command,
    kill_command,
    parse_env_pairs,
    remote_command,
    shell_script,
    snippet_command,
    status_command,
    train_command,
    worker_train_command,
    xla_dist_command,
)
from .fanout import (
    GCLOUD_SSH_KEY,
    Outcome,
    copy_to_workers,
    ensure_ssh_key,
    fan_out,
    run_on_workers,
)
from .slices import Host, hosts, nodes, requested_slices
from .target import PodError, Target, describe_workers, endpoints, make_target, worker_count

__all__ = [
    "DEVICE_PATTERNS",
    "DOCKER_RUN_FLAGS",
    "FORWARDED_PREFIXES",
    "GCLOUD_SSH_KEY",
    "KILL_SCRIPT",
    "LIBTPU_LOCKFILE",
    "NOT_FORWARDED",
    "STATUS_SCRIPT",
    "Host",
    "Outcome",
    "PodError",
    "Target",
    "copy_to_workers",
    "describe_workers",
    "docker_command",
    "endpoints",
    "ensure_ssh_key",
    "fan_out",
    "forwarded_env",
    "hosts",
    "install_command",
    "kill_command",
    "make_target",
    "nodes",
    "parse_env_pairs",
    "remote_command",
    "requested_slices",
    "run_on_workers",
    "shell_script",
    "snippet_command",
    "status_command",
    "train_command",
    "worker_count",
    "worker_train_command",
    "xla_dist_command",
]
