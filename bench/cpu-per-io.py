#!/usr/bin/env python3
"""Several nvraid binaries on one `nvraid bench` job, alternating: median
IOPS and median CPU time per I/O (user + system, from bench's own JSON
report). On a shared machine the CPU time per I/O is the steadier of the
two: it does not move with the share of the cores the run was given.

    bench/cpu-per-io.py REPS "BENCH ARGS" BINARY...

e.g. bench/cpu-per-io.py 6 "--rw randread --bs 4k --iodepth 32 --numjobs 2
--runtime 3s --ramp 1s --level 0 null:4G null:4G null:4G null:4G" OLD NEW
"""
import json, subprocess, statistics, sys
reps = int(sys.argv[1]); args = sys.argv[2].split(); bins = sys.argv[3:]
res = {b: ([], []) for b in bins}
for r in range(reps):
    for b in bins:
        p = subprocess.run([b, "bench", "--json", *args], capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"{b} failed: {p.stderr}")
        j = json.loads(p.stdout)["jobs"][0]
        d = j["read"] if j["read"]["io_bytes"] > 0 else j["write"]
        n = j["nvraid"]
        res[b][0].append(d["iops"])
        res[b][1].append(n["usr_cpu_ns_per_io"] + n["sys_cpu_ns_per_io"])
for b in bins:
    print(f"{b}: IOPS median {statistics.median(res[b][0]):.0f}, CPU ns per I/O "
          f"median {statistics.median(res[b][1]):.1f} (min {min(res[b][1]):.1f})", flush=True)
