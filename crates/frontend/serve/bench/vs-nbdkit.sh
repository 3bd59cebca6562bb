#!/usr/bin/env bash
# Compare an NBD server against nbdkit's file plugin with fio's nbd engine.
#
#   vs-nbdkit.sh URI [SIZE]
#
# URI is the server under test (e.g. nbd+unix:///?socket=/run/nvraid/nvraid.sock,
# started by the caller, e.g. `nvraid serve` of a RAID 0 over 4 files in
# /dev/shm). nbdkit serves one tmpfs file of SIZE (default 1G) as baseline.
# Workloads: 4K random read and write at QD 32, 1 MiB sequential read, each
# over 4 connections (numjobs=4), 20 s. Prints IOPS/bandwidth and ratios.
# Targets from the issue: >= 1.2x nbdkit on random I/O, >= 1.0x sequential.
set -euo pipefail

uri=${1:?usage: vs-nbdkit.sh URI [SIZE]}
size=${2:-1G}
runtime=${RUNTIME:-20}
for tool in fio nbdkit jq; do
    command -v "$tool" >/dev/null || { echo "missing $tool: apt-get install -y fio nbdkit jq" >&2; exit 1; }
done

work=$(mktemp -d /dev/shm/vs-nbdkit.XXXXXX)
trap 'kill "$nbdkit_pid" 2>/dev/null || true; rm -rf "$work"' EXIT
truncate -s "$size" "$work/disk.img"
dd if=/dev/urandom of="$work/disk.img" bs=1M count=64 conv=notrunc status=none
nbdkit --foreground --unix "$work/nbdkit.sock" --pidfile "$work/nbdkit.pid" file "$work/disk.img" &
nbdkit_pid=$!
for _ in $(seq 100); do [ -S "$work/nbdkit.sock" ] && break; sleep 0.05; done
baseline="nbd+unix:///?socket=$work/nbdkit.sock"

# run NAME URI fio-args... -> prints "iops bw_bytes"
run() {
    local uri=$1; shift
    fio --name=bench --ioengine=nbd --uri="$uri" --numjobs=4 --group_reporting \
        --time_based --runtime="$runtime" --size="$size" --output-format=json "$@" 2>/dev/null \
        | sed -n '/^{/,$p' \
        | jq -r '.jobs[0] | [(.read.iops + .write.iops), (.read.bw_bytes + .write.bw_bytes)] | @tsv'
}

printf '%-22s %14s %14s %8s\n' workload nbdkit "under test" ratio
for workload in "randread 4k 32" "randwrite 4k 32" "read 1m 8"; do
    set -- $workload
    args=(--rw="$1" --bs="$2" --iodepth="$3")
    read -r base_iops base_bw < <(run "$baseline" "${args[@]}")
    read -r test_iops test_bw < <(run "$uri" "${args[@]}")
    if [ "$1" = read ]; then
        ratio=$(echo "scale=2; $test_bw / $base_bw" | bc)
        printf '%-22s %11.0f MB/s %11.0f MB/s %7sx\n' "$*" "$(echo "$base_bw/1000000" | bc -l)" "$(echo "$test_bw/1000000" | bc -l)" "$ratio"
    else
        ratio=$(echo "scale=2; $test_iops / $base_iops" | bc)
        printf '%-22s %10.0f IOPS %10.0f IOPS %7sx\n' "$*" "$base_iops" "$test_iops" "$ratio"
    fi
done
