#!/usr/bin/env bash
# One TPU VM worker's part of `make ray-up` and `make ray-down`, sent to every worker by
# `pod run` (the same gcloud fan-out as the other pod targets):
#   ray-node.sh up HEAD_ADDRESS PORT PYTHON   worker 0 of slice 0 starts the head; every
#                                             other worker waits for it, then joins
#   ray-node.sh down PYTHON                   stops Ray on this worker
# The worker's place: TPU_WORKER_ID and MEGASCALE_SLICE_ID when set, else the TPU VM's
# metadata (agent-worker-number). PYTHON's environment gets the project's `ray` extra.
set -euo pipefail

METADATA_URL="${METADATA_URL:-http://metadata.google.internal/computeMetadata/v1}"
WAIT_SECONDS="${WAIT_SECONDS:-300}"

worker_index() {
    if [[ -n "${TPU_WORKER_ID:-}" ]]; then
        printf '%s\n' "$TPU_WORKER_ID"
        return
    fi
    curl --silent --fail --max-time 5 -H "Metadata-Flavor: Google" \
        "$METADATA_URL/instance/attributes/agent-worker-number"
}

ray_of() {
    local ray
    ray="$(dirname "$1")/ray"
    if [[ ! -x "$ray" ]]; then
        "$1" -m pip install --quiet "ray[default]>=2.58,<3"
    fi
    printf '%s\n' "$ray"
}

up() {
    local head=$1 port=$2 ray waited=0
    ray=$(ray_of "$3")
    if [[ "$(worker_index)" == 0 && "${MEGASCALE_SLICE_ID:-0}" == 0 ]]; then
        "$ray" start --head --node-ip-address="$head" --port="$port" --disable-usage-stats
        return
    fi
    until (exec 3<>"/dev/tcp/$head/$port") 2>/dev/null; do
        if ((waited >= WAIT_SECONDS)); then
            printf 'error: no Ray head at %s:%s after %ss\n' "$head" "$port" "$waited" >&2
            exit 1
        fi
        sleep 2
        waited=$((waited + 2))
    done
    "$ray" start --address="$head:$port" --disable-usage-stats
}

case "${1:-}" in
    up) up "$2" "$3" "$4" ;;
    down) "$(dirname "$2")/ray" stop ;;
    *)
        printf 'usage: %s up HEAD_ADDRESS PORT PYTHON | down PYTHON\n' "$0" >&2
        exit 2
        ;;
esac
