#!/usr/bin/env python3
"""What md's write-intent bitmap costs nvraid's random writes: one RAID 1 of
two 1 GiB tmpfs files (/dev/shm), created three ways and benchmarked in
turn, alternating, with 4K random writes at QD 32 (2 workers, 3 s each after
a 1 s ramp, 5 repetitions):

  none      create --bitmap none
  64M       create --bitmap internal (mdadm's default chunk, 16 bits here)
  1M        create --bitmap internal --bitmap-chunk 1M (1024 bits: every
            chunk is written again and again, the clearing daemon runs)

    bench/bitmap-cost.py [NVRAID]      (default: target/release/nvraid)

Prints IOPS per run and the median ratio bitmap/none (target >= 0.95).
"""
import json, subprocess, statistics, sys, os
NV = sys.argv[1] if len(sys.argv) > 1 else "target/release/nvraid"
members = [f"/dev/shm/bmcost{i}.img" for i in range(2)]
CONFIGS = {"none": ["--bitmap", "none"], "64M": ["--bitmap", "internal"],
           "1M": ["--bitmap", "internal", "--bitmap-chunk", "1M"]}

def create(config):
    for m in members:
        if os.path.exists(m):
            os.remove(m)
        subprocess.run(["truncate", "-s", "1G", m], check=True)
    subprocess.run([NV, "create", "--level", "1", "--force", *CONFIGS[config], *members],
                   check=True, capture_output=True)

def run():
    p = subprocess.run([NV, "bench", "--json", "--rw", "randwrite", "--bs", "4k", "--iodepth", "32",
                        "--numjobs", "2", "--runtime", "3s", "--ramp", "1s", "--destructive", *members],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"bench failed: {p.stderr}")
    return json.loads(p.stdout)["jobs"][0]["write"]["iops"]

iops = {c: [] for c in CONFIGS}
create("none")
run()  # warm-up (tmpfs, page cache, CPU clocks), not counted
for rep in range(5):
    for config in CONFIGS:
        create(config)
        iops[config].append(run())
    print(f"rep {rep}: " + ", ".join(f"{c} {iops[c][-1]:.0f}" for c in CONFIGS), flush=True)
for config in ("64M", "1M"):
    ratios = [b / n for b, n in zip(iops[config], iops["none"])]
    print(f"bitmap {config}/none: median {statistics.median(ratios):.3f} runs {[round(r, 3) for r in ratios]}")
for m in members:
    os.remove(m)
