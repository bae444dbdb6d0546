#!/usr/bin/env bash
# The TOKENS/S column at the end of `make demo` against the summary's mean, RUNS times (default 10), one after the
# other: the column is the last 10 steps' rate, the mean steps 2..N's; a step read back at once once made the
# column 250x the mean. Prints one line a run; needs `make setup`.
#
#   bench/demo_columns.sh [RUNS]
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10}
out=$(mktemp -d)
for i in $(seq 1 "$runs"); do
  start=$SECONDS
  .venv/bin/fsdpctl run-local -f examples/tiny-cpu.yaml --status-out "$out/$i.json" > "$out/$i.log" 2>&1
  rc=$?
  .venv/bin/python - "$out/$i.json" "$i" "$rc" "$((SECONDS - start))" <<'PY'
import json, sys
path, i, rc, secs = sys.argv[1:]
s = json.load(open(path))["status"]
col, mean = s["progress"].get("tokensPerSecond"), s["result"].get("tokensPerSecond")
print(f"run {i}: exit {rc}, {secs} s, phase {s['phase']}, column {col}, mean {mean}, ratio {col / mean:.2f}")
PY
done
echo "logs in $out"
