#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# An example trainer killed (SIGKILL) in the middle of an epoch continues from its last
# checkpoint when the same command runs again, and ends with the parameters of a run that was
# never interrupted (the summary's params_xxh3).
#   kill_resume.sh PROGRAM WORK ARGS...
set -euo pipefail
program="$1"; work="$2"; shift 2
rm -rf "$work"; mkdir -p "$work"; cd "$work"

summary_hash() { sed -n 's/.*summary: .*params_xxh3 \([0-9a-f]*\).*/\1/p' "$1"; }

"$program" "$@" --run_name straight > straight.log 2>&1 || { cat straight.log; exit 1; }
straight=$(summary_hash straight.log)
[ -n "$straight" ] || { echo "no summary in the uninterrupted run:"; cat straight.log; exit 1; }

"$program" "$@" --run_name killed > killed.log 2>&1 &
pid=$!
for _ in $(seq 1 2400); do  # up to 120 s
  grep -q "checkpoint .*killed/epoch-1" killed.log && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.05
done
if ! kill -KILL "$pid" 2>/dev/null; then
  echo "the run ended before it could be killed after its first checkpoint:"; cat killed.log; exit 1
fi
wait "$pid" 2>/dev/null || true
if ! grep -q "checkpoint .*killed/epoch-1" killed.log || grep -q "epoch 2/" killed.log; then
  echo "the run was not killed in its second epoch:"; cat killed.log; exit 1
fi
echo "killed in epoch 2 after: $(grep "checkpoint .*killed/epoch-1" killed.log)"

"$program" "$@" --run_name killed > resumed.log 2>&1 || { cat resumed.log; exit 1; }
grep -q "run killed: resumed from .*killed/epoch-1 " resumed.log ||
  { echo "the second run did not resume from epoch-1:"; cat resumed.log; exit 1; }
resumed=$(summary_hash resumed.log)
if [ "$resumed" != "$straight" ]; then
  echo "params_xxh3 after the resume $resumed, uninterrupted $straight"; exit 1
fi
echo "resumed from epoch-1 and ended with the uninterrupted run's parameters ($straight)"
