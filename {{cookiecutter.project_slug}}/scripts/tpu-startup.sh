#!/usr/bin/env bash
# TPU VM startup script: runs on every worker at boot, via
#   --metadata-from-file startup-script=scripts/tpu-startup.sh
# Installs torch the way the Dockerfile does: torch from the CPU wheel index (a TPU VM
# needs no CUDA; the default index would fetch ~3 GB of it), then {% if cookiecutter.backend == "torch_tpu" %}torch-tpu (TorchTPU) with
# libtpu{% else %}torch_xla[tpu] with
# libtpu{% endif %} from the pip index. Idempotent: what is installed already is not redone.
# Progress goes to the log as "step N/M: ..." lines and to the guest attribute
# {{ cookiecutter.project_slug }}/startup; `make tpu-status` shows both. The marker
# file is written last: it says the worker is ready.
# DRY_RUN=1 prints the commands instead of running them.
set -Eeuo pipefail

PROJECT_DIR="${PROJECT_DIR:-/opt/{{ cookiecutter.project_slug }}}"
VENV="${VENV:-$PROJECT_DIR/.venv}"
LOG="${LOG:-/var/log/{{ cookiecutter.project_slug }}-startup.log}"
MARKER="${MARKER:-/var/lib/{{ cookiecutter.project_slug }}/startup.done}"
IMAGE="${IMAGE:-}"
CACHE_DIR="${CACHE_DIR:-/var/cache/{{ cookiecutter.project_slug }}/xla}"
DRY_RUN="${DRY_RUN:-0}"
PYTHON="${PYTHON:-python3}"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
METADATA_URL="${METADATA_URL:-http://metadata.google.internal/computeMetadata/v1}"
{%- if cookiecutter.backend == "torch_tpu" %}
TORCH_VERSION=2.13.0
TORCH_TPU_VERSION=0.2.0
{%- else %}
TORCH_VERSION=2.9.0
TORCH_XLA_VERSION=2.9.0
{%- endif %}
ATTRIBUTE="{{ cookiecutter.project_slug }}/startup"
STEPS=4
current="starting"

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

# Publish the progress as a guest attribute (best effort: the log has it too).
publish() {
    [[ "$DRY_RUN" == "1" ]] && return 0
    command -v curl >/dev/null 2>&1 || return 0
    curl --silent --fail --max-time 3 -X PUT --data "$1" -H "Metadata-Flavor: Google" \
        "$METADATA_URL/instance/guest-attributes/$ATTRIBUTE" >/dev/null 2>&1 || true
}

step() {
    current="step $1/$STEPS: $2"
    log "$current"
    publish "$1/$STEPS $2"
}

failed() {
    local code=$?
    log "failed at $current (exit $code)"
    publish "failed at $current (exit $code)"
    exit "$code"
}

# The version of a package in the virtual environment, without a local suffix (+cpu).
installed() {
    [[ -x "$VENV/bin/python" ]] || return 0
    local version
    version="$("$VENV/bin/python" -c 'import importlib.metadata as m, sys
try:
    print(m.version(sys.argv[1]))
except m.PackageNotFoundError:
    pass' "$1" 2>/dev/null)" || return 0
    printf '%s' "${version%%+*}"
}

main() {
    trap failed ERR
    if [[ -f "$MARKER" ]]; then
        log "already prepared ($MARKER); nothing to do"
        publish "$STEPS/$STEPS ready"
        return 0
    fi
    step 1 "preparing $(hostname): $PROJECT_DIR, $CACHE_DIR"
    run mkdir -p "$PROJECT_DIR" "$CACHE_DIR" "$(dirname "$MARKER")"
    if [[ -n "$IMAGE" ]]; then
        step 2 "pulling $IMAGE"
        run docker pull "$IMAGE"
        step 3 "torch and {% if cookiecutter.backend == "torch_tpu" %}torch-tpu{% else %}torch_xla{% endif %} come with the image"
    else
        step 2 "virtual environment $VENV"
        if [[ -x "$VENV/bin/python" ]]; then
            log "$VENV exists"
        else
            run "$PYTHON" -m venv "$VENV"
            run "$VENV/bin/python" -m pip install --quiet --upgrade pip
        fi
{%- if cookiecutter.backend == "torch_tpu" %}
        step 3 "torch==$TORCH_VERSION from $TORCH_INDEX_URL, then torch-tpu==$TORCH_TPU_VERSION"
{%- else %}
        step 3 "torch==$TORCH_VERSION from $TORCH_INDEX_URL, then torch_xla[tpu]==$TORCH_XLA_VERSION"
{%- endif %}
        if [[ "$(installed torch)" == "$TORCH_VERSION" ]]; then
            log "torch $TORCH_VERSION is installed"
        else
            run "$VENV/bin/python" -m pip install --quiet --index-url "$TORCH_INDEX_URL" \
                "torch==$TORCH_VERSION"
        fi
{%- if cookiecutter.backend == "torch_tpu" %}
        if [[ "$(installed torch_tpu)" == "$TORCH_TPU_VERSION" ]]; then
            log "torch-tpu $TORCH_TPU_VERSION is installed"
        else
            run "$VENV/bin/python" -m pip install --quiet "torch-tpu==$TORCH_TPU_VERSION"
        fi
{%- else %}
        if [[ "$(installed torch_xla)" == "$TORCH_XLA_VERSION" ]]; then
            log "torch_xla $TORCH_XLA_VERSION is installed"
        else
            run "$VENV/bin/python" -m pip install --quiet "torch_xla[tpu]==$TORCH_XLA_VERSION"
        fi
{%- endif %}
    fi
    run touch "$MARKER"
    step 4 "ready"
}

if [[ "$DRY_RUN" == "1" ]]; then
    main
else
    mkdir -p "$(dirname "$LOG")"
    main >>"$LOG" 2>&1
fi
