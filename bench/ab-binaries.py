#!/usr/bin/env python3
"""Two nvraid binaries side by side on one RAID 0, alternating (an A/B check
that a change did not slow the fast path).

    bench/ab-binaries.py OLD_NVRAID NEW_NVRAID [LEVEL]

Creates a 4-member array (RAID 0 unless LEVEL says 1, 10, 5 or 6; the
redundant ones without a bitmap) of 1 GiB tmpfs files (/dev/shm), then runs
`nvraid bench` with each binary in turn, 5 repetitions of 3 s per workload
(4K random read QD 32, 4K random write QD 32, 1 MiB sequential read QD 8; 2
workers), and prints new/old IOPS per repetition and the median.
"""
import json, subprocess, statistics, sys, os
OLD, NEW = sys.argv[1], sys.argv[2]
LEVEL = sys.argv[3] if len(sys.argv) > 3 else "0"
members = [f"/dev/shm/ab{i}.img" for i in range(4)]
for m in members:
    subprocess.run(["truncate", "-s", "1G", m], check=True)
bitmap = [] if LEVEL == "0" else ["--bitmap", "none"]
subprocess.run([NEW, "create", "--level", LEVEL, *bitmap, "--force", *members], check=True,
               capture_output=True)
def run(binary, rw, bs, depth):
    p = subprocess.run([binary, "bench", "--json", "--rw", rw, "--bs", bs, "--iodepth", str(depth), "--numjobs", "2",
        "--runtime", "3s", "--ramp", "1s", "--destructive", *members], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{binary} failed: {p.stderr}")
    out = p.stdout
    job = json.loads(out)["jobs"][0]
    d = job["read"] if job["read"]["io_bytes"] > 0 else job["write"]
    return d["iops"]
for rw, bs, depth in [("randread", "4k", 32), ("randwrite", "4k", 32), ("read", "1m", 8)]:
    ratios = []
    for rep in range(5):
        old = run(OLD, rw, bs, depth)
        new = run(NEW, rw, bs, depth)
        ratios.append(new / old)
    print(f"{rw} {bs} QD{depth}: new/old median {statistics.median(ratios):.3f} runs {[round(r,3) for r in ratios]}", flush=True)
for m in members:
    os.remove(m)
