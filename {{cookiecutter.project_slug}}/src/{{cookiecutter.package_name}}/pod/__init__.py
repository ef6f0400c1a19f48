"""The pod launcher: one command on every worker of a TPU, through `gcloud compute tpus`.

- `target`: the TPU (name, zone, project, gcloud) and its worker count;
- `commands`: the shell lines the workers run, and the shell files shipped with them
  (`kill.sh` frees the TPU, `status.sh` reads the startup script's progress);
- `fanout`: one ssh or scp per worker, all at once, output prefixed, fail-fast;
- `launch` and `cli`: the `pod run|sync|train|kill|status` commands.

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
from .target import PodError, Target, make_target, worker_count

__all__ = [
    "DEVICE_PATTERNS",
    "DOCKER_RUN_FLAGS",
    "FORWARDED_PREFIXES",
    "GCLOUD_SSH_KEY",
    "KILL_SCRIPT",
    "LIBTPU_LOCKFILE",
    "NOT_FORWARDED",
    "STATUS_SCRIPT",
    "Outcome",
    "PodError",
    "Target",
    "copy_to_workers",
    "docker_command",
    "ensure_ssh_key",
    "fan_out",
    "forwarded_env",
    "install_command",
    "kill_command",
    "make_target",
    "parse_env_pairs",
    "remote_command",
    "run_on_workers",
    "shell_script",
    "snippet_command",
    "status_command",
    "train_command",
    "worker_count",
    "xla_dist_command",
]
