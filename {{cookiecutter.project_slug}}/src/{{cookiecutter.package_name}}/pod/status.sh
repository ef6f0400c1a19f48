#!/usr/bin/env bash
# Readiness of one worker: the startup script writes its marker when it is done and logs
# "step N/M: ..." lines on the way. `pod status` sends this file to every worker as
# `bash -c <this file> pod MARKER LOG`; exit 1 until the marker exists.
marker="$1"
log="$2"
last="$(tail -n 1 -- "$log" 2>/dev/null)" || last="no log at $log"
if [ -f "$marker" ]; then
    echo "ready: $last"
else
    echo "not ready: ${last:-empty log at $log}"
    exit 1
fi
