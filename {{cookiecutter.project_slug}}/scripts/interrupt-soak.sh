#!/usr/bin/env bash
# Repeat the tests that interrupt, preempt or kill a process, ROUNDS times in a row (20 unless
# given), under `stress` on every core when it is installed: each round's time; the first
# failure stops the rounds and shows its output.
#   scripts/interrupt-soak.sh [ROUNDS] [PYTEST ARGUMENTS...]   (default: -m interrupts)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-20}"
if [ "$#" -gt 0 ]; then shift; fi
if [ "$#" -eq 0 ]; then set -- -m interrupts; fi
logs="$(mktemp -d)"
stress_pid=""
finish() {
  if [ -n "$stress_pid" ]; then
    # Its workers: stress reaps each and exits once none is left, so waiting for it means
    # no load is left behind.
    pkill -P "$stress_pid" || true
    wait "$stress_pid" 2>/dev/null || true
  fi
}
trap finish EXIT
if command -v stress >/dev/null; then
  stress --cpu "$(nproc)" >/dev/null 2>&1 &
  stress_pid=$!
  echo "stress --cpu $(nproc) (pid $stress_pid) loads every core"
else
  echo "stress is not installed (apt-get install stress): the rounds run without load" >&2
fi
python=python  # the project's .venv (`make install`) when there is one
if [ -x .venv/bin/python ]; then python=.venv/bin/python; fi
export PJRT_DEVICE=CPU REQUIRE_GCS_EMULATOR=1 PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
total=$SECONDS
for round in $(seq "$rounds"); do
  start=$SECONDS
  log="$logs/round-$round.log"
  if ! "$python" -m pytest -p no:randomly -q "$@" >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "round $round of $rounds FAILED after $((SECONDS - start)) s (log: $log)"
    exit 1
  fi
  echo "round $round of $rounds: $(tail -n 1 "$log" | tr -d '=') in $((SECONDS - start)) s"
done
echo "$rounds rounds passed in $((SECONDS - total)) s"
rm -rf "$logs"
