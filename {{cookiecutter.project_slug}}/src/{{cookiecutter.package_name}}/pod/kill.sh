#!/usr/bin/env bash
# Frees the TPU on one worker: stops the processes holding its device files (SIGTERM,
# then SIGKILL after 10 s) and removes the libtpu lockfile. `pod kill` sends this file
# to every worker as `bash -c <this file> pod LOCKFILE DEVICE_GLOB...`.
set -u
alive() {  # a zombie has let go of its files already
    local state
    state="$(ps -o stat= -p "$1" 2>/dev/null)" || return 1
    [ "${state#Z}" = "$state" ]
}
lockfile="$1"
shift
shopt -s nullglob
devices=()
for pattern in "$@"; do
    # shellcheck disable=SC2206  # the pattern is meant to expand here
    devices+=($pattern)
done
pids=""
if [ "${#devices[@]}" -gt 0 ]; then
    if command -v lsof >/dev/null 2>&1; then
        pids="$(lsof -t -- "${devices[@]}" 2>/dev/null | sort -u | tr '\n' ' ')"
    else
        pids="$(fuser -- "${devices[@]}" 2>/dev/null | tr -s ' ')"
    fi
fi
if [ -n "${pids// /}" ]; then
    echo "stopping $pids (holding ${devices[*]})"
    # shellcheck disable=SC2086  # one word per pid
    kill -TERM $pids 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        left=""
        for pid in $pids; do
            if alive "$pid"; then left="$left $pid"; fi
        done
        [ -z "$left" ] && break
        sleep 1
    done
    for pid in $pids; do
        if alive "$pid"; then
            echo "killing $pid"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
else
    echo "no process holds the TPU"
fi
if [ -e "$lockfile" ]; then
    rm -f -- "$lockfile"
    echo "removed $lockfile"
fi
