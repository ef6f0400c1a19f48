#!/usr/bin/env bash
# Repeat the tests that interrupt, preempt or kill a process, ROUNDS times in a row (20 unless
# given), under `stress` on every core when it is installed: each round's time; the first
# failure stops the rounds and shows its output.
#   scripts/interrupt-soak.sh [ROUNDS] [PYTEST ARGUMENTS...]   (default: -m interrupts)
# SOAK_JOBS=N runs N of a round's test files at once, each in its own pytest (the longest of
# the previous round first): more load on the tests, and rounds in less time.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-20}"
if [ "$#" -gt 0 ]; then shift; fi
if [ "$#" -eq 0 ]; then set -- -m interrupts; fi
jobs="${SOAK_JOBS:-1}"
if ! [[ "$jobs" =~ ^[1-9][0-9]*$ ]]; then
  echo "SOAK_JOBS must be a positive number, not '$jobs'" >&2
  exit 2
fi
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

COLLECT='
import sys

import pytest


class Selected:
    def pytest_collection_finish(self, session):
        for item in session.items:
            print(str(item.path) + "::" + item.nodeid.partition("::")[2], file=sys.__stdout__)


pytest.main(["-p", "no:randomly", "-qq", "--co", *sys.argv[1:]], plugins=[Selected()])
'
# With SOAK_JOBS > 1: the selected tests by file, and the options without the paths.
declare -A tests_of=()
options=()
if [ "$jobs" -gt 1 ]; then
  for arg in "$@"; do
    if [[ "$arg" != *::* && ! -e "$arg" ]]; then options+=("$arg"); fi
  done
  # Each selected test as FILE::NAME with the file's absolute path (pytest's own ids are
  # relative to a root that depends on the arguments).
  while read -r test; do
    if [[ "$test" != /*::* ]]; then continue; fi  # pytest's own lines
    tests_of[${test%%::*}]+="$test "
  done < <("$python" -c "$COLLECT" "$@")
  count=$(printf "%s\n" "${!tests_of[@]}" | grep -c . || true)
  if [ "$count" -eq 0 ]; then
    echo "no test selected by: $*" >&2
    exit 1
  fi
  echo "$jobs test files at once, of $count"
fi

# One round's files at once, SOAK_JOBS at a time, longest first: "FILE SECONDS EXIT" lines.
run_files() {
  local folder="$1" order running=0 failed=0
  if [ -f "$logs/times" ]; then
    order="$(sort -k2,2nr "$logs/times" | cut -d' ' -f1)"
  else
    order="$(printf '%s\n' "${!tests_of[@]}" | sort)"
  fi
  : >"$folder/times"
  for file in $order; do
    if [ "$running" -ge "$jobs" ]; then
      wait -n || failed=1
      running=$((running - 1))
    fi
    (
      set -f  # test ids such as test_x[one-device] are not patterns
      start=$SECONDS
      # shellcheck disable=SC2086  # the file's test ids, one word each
      if "$python" -m pytest -p no:randomly -q "${options[@]}" ${tests_of[$file]} \
        >"$folder/$(basename "$file").log" 2>&1; then code=0; else code=$?; fi
      echo "$file $((SECONDS - start)) $code" >>"$folder/times"
      exit "$code"
    ) &
    running=$((running + 1))
  done
  while [ "$running" -gt 0 ]; do
    wait -n || failed=1
    running=$((running - 1))
  done
  cp "$folder/times" "$logs/times"
  return "$failed"
}

total=$SECONDS
for round in $(seq "$rounds"); do
  start=$SECONDS
  if [ "$jobs" -le 1 ]; then
    log="$logs/round-$round.log"
    if ! "$python" -m pytest -p no:randomly -q "$@" >"$log" 2>&1; then
      tail -n 60 "$log"
      echo "round $round of $rounds FAILED after $((SECONDS - start)) s (log: $log)"
      exit 1
    fi
    echo "round $round of $rounds: $(tail -n 1 "$log" | tr -d '=') in $((SECONDS - start)) s"
    continue
  fi
  folder="$logs/round-$round"
  mkdir "$folder"
  if ! run_files "$folder"; then
    awk '$3 != 0 {print $1}' "$folder/times" | while read -r failed; do
      tail -n 60 "$folder/$(basename "$failed").log"
    done
    echo "round $round of $rounds FAILED after $((SECONDS - start)) s (logs: $folder)"
    exit 1
  fi
  passed=$(cat "$folder"/*.log | grep -o '[0-9]* passed' | awk '{n += $1} END {print n}')
  files=$(sort "$folder/times" | awk '{printf "%s%s %s s", sep, $1, $2; sep=", "}')
  echo "round $round of $rounds: $passed passed in $((SECONDS - start)) s ($files)"
done
echo "$rounds rounds passed in $((SECONDS - total)) s"
rm -rf "$logs"
