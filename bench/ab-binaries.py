#!/usr/bin/env python3
"""Two nvraid binaries side by side on one array, alternating (an A/B check
that a change did not slow the fast path).

    bench/ab-binaries.py OLD_NVRAID NEW_NVRAID [LEVEL] [--null] [--reps N]
                         [--only randread,randwrite,read]

Default: creates a 4-member array (RAID 0 unless LEVEL says 1, 10, 4, 5 or
6; the redundant ones without a bitmap) of 1 GiB tmpfs files (/dev/shm),
then runs `nvraid bench` with each binary in turn, 5 repetitions of 3 s per
workload (4K random read QD 32, 4K random write QD 32, 1 MiB sequential
read QD 8; 2 workers), and prints new/old IOPS per repetition, the median,
and each binary's median IOPS.

With --null the members are four `null:4G` members (no storage: reads
return zeros, writes are dropped), formed into a throwaway array of LEVEL
by each binary (`bench --level`): the engine's own cost per I/O, with no
kernel I/O underneath.
"""
import argparse, json, subprocess, statistics, sys, os

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("old")
ap.add_argument("new")
ap.add_argument("level", nargs="?", default="0")
ap.add_argument("--null", action="store_true", help="null: members (engine cost only)")
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--only", default="randread,randwrite,read",
                help="comma-separated subset of randread,randwrite,read")
args = ap.parse_args()
OLD, NEW, LEVEL = args.old, args.new, args.level

if args.null:
    members = ["null:4G"] * 4
    layout = ["--level", LEVEL]
else:
    members = [f"/dev/shm/ab{i}.img" for i in range(4)]
    for m in members:
        subprocess.run(["truncate", "-s", "1G", m], check=True)
    bitmap = [] if LEVEL == "0" else ["--bitmap", "none"]
    subprocess.run([NEW, "create", "--level", LEVEL, *bitmap, "--force", *members], check=True,
                   capture_output=True)
    layout = []


def run(binary, rw, bs, depth):
    p = subprocess.run([binary, "bench", "--json", "--rw", rw, "--bs", bs, "--iodepth", str(depth),
                        "--numjobs", "2", "--runtime", "3s", "--ramp", "1s", "--destructive",
                        *layout, *members], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{binary} failed: {p.stderr}")
    job = json.loads(p.stdout)["jobs"][0]
    d = job["read"] if job["read"]["io_bytes"] > 0 else job["write"]
    return d["iops"]


workloads = [("randread", "4k", 32), ("randwrite", "4k", 32), ("read", "1m", 8)]
wanted = set(args.only.split(","))
for rw, bs, depth in workloads:
    if rw not in wanted:
        continue
    ratios, olds, news = [], [], []
    for rep in range(args.reps):
        old = run(OLD, rw, bs, depth)
        new = run(NEW, rw, bs, depth)
        olds.append(old)
        news.append(new)
        ratios.append(new / old)
    print(f"{rw} {bs} QD{depth}: new/old median {statistics.median(ratios):.3f} "
          f"range {min(ratios):.3f}-{max(ratios):.3f} runs {[round(r, 3) for r in ratios]} "
          f"(IOPS median old {statistics.median(olds):.0f}, new {statistics.median(news):.0f})",
          flush=True)
if not args.null:
    for m in members:
        os.remove(m)
