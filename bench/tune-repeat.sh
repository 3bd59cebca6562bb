#!/usr/bin/env bash
# `nvraid tune` three times (or N) on 4 zram members of 256 MiB, with the
# default workload and RAID 0 unless WORKLOAD and LEVEL say otherwise: prints each run's
# recommendation, the margin of the best score over the second best, the
# chunks within noise, and how long the run took. Needs root (zram).
#
#   bench/tune-repeat.sh [RUNS]          # default 3
#   LEVEL=5 bench/tune-repeat.sh         # another level
#   WORKLOAD=rw=write,bs=1m,iodepth=8 bench/tune-repeat.sh   # another workload
#   NVRAID=path/to/nvraid bench/tune-repeat.sh
#
# The zram devices are made with `zramctl --find` and reset at exit; no
# other zram device is touched.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
nvraid=${NVRAID:-$root/target/release/nvraid}
[ -x "$nvraid" ] || (cd "$root" && cargo build --release -p nvraid)
runs=${1:-3}
level=${LEVEL:-0}
workload=${WORKLOAD:-default}
[ "$(id -u)" = 0 ] || { echo "tune-repeat: needs root for zram" >&2; exit 1; }
modprobe zram 2>/dev/null || true

devs=()
out=$(mktemp -d /tmp/nvraid-tune-repeat.XXXXXX)
cleanup() {
    for d in "${devs[@]}"; do zramctl --reset "$d" 2>/dev/null || true; done
    rm -rf "$out"
}
trap cleanup EXIT
for _ in 1 2 3 4; do
    devs+=("$(zramctl --find --size 256M)")
done
echo "members: ${devs[*]} (zram, 256 MiB each), raid$level, workload $workload; $(nproc) CPUs; load: $(cut -d' ' -f1-3 /proc/loadavg)"

printf '%-4s %-8s %-8s %-10s %-40s %s\n' run winner margin seconds "within noise" "best score"
for run in $(seq 1 "$runs"); do
    start=$(date +%s.%N)
    "$nvraid" tune --level "$level" --workload "$workload" --destructive --json "${devs[@]}" \
        >"$out/run$run.json" 2>"$out/run$run.err"
    end=$(date +%s.%N)
    python3 - "$out/run$run.json" "$run" "$start" "$end" <<'EOF'
import json, math, sys
doc = json.load(open(sys.argv[1]))
keys = [m["key"] for m in doc["metrics"]]
rows = [[c["values"][k] for k in keys] for c in doc["chunks"]]
best = [max(r[m] for r in rows) for m in range(len(keys))]
scores = []
for c, r in zip(doc["chunks"], rows):
    logs = [math.log(v / b) if b > 0 else 0.0 for v, b in zip(r, best)]
    scores.append((math.exp(sum(logs) / len(logs)), c["chunk_bytes"]))
scores.sort(reverse=True)
name = lambda b: f"{b >> 20}M" if b >= 1 << 20 else f"{b >> 10}K"
rec = doc["recommendation"]
margin = (scores[0][0] / scores[1][0] - 1) * 100 if len(scores) > 1 else float("inf")
tied = ",".join(name(b) for b in rec["within_noise"]) or "-"
print(f"{sys.argv[2]:<4} {name(rec['chunk_bytes']):<8} {margin:>5.1f}%   "
      f"{float(sys.argv[4]) - float(sys.argv[3]):>7.1f}    {tied:<40} "
      f"{name(scores[0][1])} {scores[0][0]:.3f}")
EOF
done
for run in $(seq 1 "$runs"); do
    echo "run $run: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["recommendation"]["reason"])' "$out/run$run.json")"
done
