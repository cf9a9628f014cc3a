#!/usr/bin/env bash
# Where one committed save's CPU goes at ~1 GB per rank: one 1gb run of an overhead arm, a
# system-wide `perf` profile of the 30 s after step 8 (the first save), and py-spy of both rank
# processes over the same window.
#
#   bash jobs/bench/overhead/profile_save.sh [ARM] [OUT_PREFIX]   # ARM: ours-nolocal (default),
#                                                                # torchrun-dcp, ...
# Needs `perf` with system-wide sampling allowed (root, or kernel.perf_event_paranoid <= 0) and
# `py-spy` on PATH; run it with the project's venv active. Writes OUT_PREFIX-ARM/perf_comm.txt
# (CPU samples per thread name) and perf_top.txt (per thread name and function).
set -u
arm=${1:-ours-nolocal}
out=${2:-/tmp/rr-profile-save}-$arm
rm -rf "$out"; mkdir -p "$out"
cd "$(dirname "$0")/../../.."
python jobs/bench/bench_overhead.py --sizes 1gb --arms "$arm" --reps 1 --out "$out/res" \
  --work "$out/w" > "$out/bench.log" 2>&1 &
bench=$!
for _ in $(seq 1 1200); do
  f=$(ls "$out"/w/1gb/*/events/rank0*.jsonl 2>/dev/null | head -1)
  if [ -n "$f" ] && grep -q '"step": 8,' "$f"; then break; fi
  sleep 0.5
done
echo "step 8 at $(date +%T)" >> "$out/bench.log"
# the rank processes of this run only: their pids are in their event logs' names
for log in "$out"/w/1gb/*/events/rank*-pid*.jsonl; do
  pid=$(basename "$log" | sed -E 's/.*-pid([0-9]+).*/\1/')
  timeout 60 py-spy record -p "$pid" -d 30 -r 50 --nonblocking --threads --idle -f raw \
    -o "$out/pyspy-$pid.txt" > /dev/null 2>&1 &
done
perf record -a -g -F 99 -o "$out/perf.data" -- sleep 30 > "$out/perf.log" 2>&1
wait "$bench"
perf report -i "$out/perf.data" --no-children --sort comm,sym --stdio -g none 2>/dev/null \
  | grep -v "^#" | grep -v "^$" | head -60 > "$out/perf_top.txt"
perf report -i "$out/perf.data" --no-children --sort comm --stdio -g none 2>/dev/null \
  | grep -v "^#" | grep -v "^$" | head -30 > "$out/perf_comm.txt"
echo "wrote $out/perf_comm.txt and $out/perf_top.txt"
