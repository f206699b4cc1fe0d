#!/usr/bin/env bash
# The README's test command started in the background from a script, beside a CPU hog: the suite
# must pass on a loaded machine with no terminal (its servers, workers and timeouts cannot lean on
# an idle CPU or a tty). Prints the time, the exit status and the last lines of the log.
#
#     bash benchmarks/suite_beside_a_hog.sh [HOGS]      # HOGS busy processes (default: one per core)
set -uo pipefail
cd "$(dirname "$0")/.."
hogs=${1:-$(nproc)}
log=$(mktemp -t fuelline-suite-XXXXXX.log)
pids=()
for _ in $(seq "$hogs"); do
  python3 -c "while True: pass" & pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
test_command=$(grep -m1 -E '^pip install .*pytest' README.md | sed 's/^.*&& //')
started=$SECONDS
nohup bash -c "$test_command" </dev/null >"$log" 2>&1 &
wait $!
status=$?
echo "beside $hogs CPU hog(s), in the background: '$test_command' exited $status in $((SECONDS - started)) s"
tail -n 5 "$log"
echo "log: $log"
exit $status
