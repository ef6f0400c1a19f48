#!/usr/bin/env bash
# TPU VM startup script: runs on every worker at boot, via
#   --metadata-from-file startup-script=scripts/tpu-startup.sh
# Idempotent: a finished step is not redone; the last line of the log and the
# marker file tell `make tpu-status` whether the worker is ready.
# DRY_RUN=1 prints the commands instead of running them.
set -euo pipefail

PROJECT_DIR="${PROJECT_DIR:-/opt/{{ cookiecutter.project_slug }}}"
VENV="${VENV:-$PROJECT_DIR/.venv}"
LOG="${LOG:-/var/log/{{ cookiecutter.project_slug }}-startup.log}"
MARKER="${MARKER:-/var/lib/{{ cookiecutter.project_slug }}/startup.done}"
IMAGE="${IMAGE:-}"
CACHE_DIR="${CACHE_DIR:-/var/cache/{{ cookiecutter.project_slug }}/xla}"
DRY_RUN="${DRY_RUN:-0}"
PYTHON="${PYTHON:-python3}"

run() {
    if [[ "$DRY_RUN" == "1" ]]; then
        printf 'would run: %s\n' "$*"
    else
        "$@"
    fi
}

log() {
    printf '%s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"
}

main() {
    if [[ -f "$MARKER" ]]; then
        log "already prepared ($MARKER); nothing to do"
        return 0
    fi
    log "preparing worker $(hostname)"
    run mkdir -p "$PROJECT_DIR" "$CACHE_DIR" "$(dirname "$MARKER")"
    if [[ -n "$IMAGE" ]]; then
        log "pulling $IMAGE"
        run docker pull "$IMAGE"
    else
        log "installing torch==2.9.0 and torch_xla[tpu]==2.9.0 into $VENV"
        [[ -x "$VENV/bin/python" ]] || run "$PYTHON" -m venv "$VENV"
        run "$VENV/bin/python" -m pip install --quiet --upgrade pip
        run "$VENV/bin/python" -m pip install --quiet torch==2.9.0 'torch_xla[tpu]==2.9.0'
    fi
    run touch "$MARKER"
    log "ready"
}

if [[ "$DRY_RUN" == "1" ]]; then
    main
else
    mkdir -p "$(dirname "$LOG")"
    main >>"$LOG" 2>&1
fi
