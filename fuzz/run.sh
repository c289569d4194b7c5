#!/usr/bin/env bash
# Builds every fuzz target and runs each for a bounded time (FUZZ_SECONDS, default 120),
# printing a summary line per target: executions, final corpus size, crashes.
# Long runs only: does nothing unless DEERMEM_LONG=1.
set -euo pipefail
cd "$(dirname "$0")"
if [ "${DEERMEM_LONG:-}" != "1" ]; then
  echo "fuzz/run.sh: skipped (set DEERMEM_LONG=1 to run the fuzz targets)"
  exit 0
fi
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
seconds="${FUZZ_SECONDS:-120}"
export RUSTC_BOOTSTRAP=1
cargo fuzz build -O -s none
status=0
for target in $(cargo fuzz list); do
  work="$(mktemp -d)"
  cp -r "corpus/$target/." "$work/"
  log="$(mktemp)"
  if cargo fuzz run -O -s none "$target" "$work" -- -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1; then
    result=ok
  else
    result=CRASH
    status=1
    tail -40 "$log"
  fi
  execs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')"
  echo "FUZZ $target result=$result seconds=$seconds executions=$execs corpus=$(ls "$work" | wc -l) seeds=$(ls "corpus/$target" | wc -l)"
  rm -rf "$work" "$log"
done
exit "$status"
