#!/usr/bin/env python3
"""NVMe/TCP members against NBD members on the storage-network bed, with the
same server program and the same storage: two beds side by side (bench/san,
prefixes nvsanA and nvsanB), N nodes each, every node serving its own RAID 0
of two /dev/shm files with `nvraid serve`: over NBD (--backend nvraid) on
one bed, over NVMe/TCP (--backend nvraid-nvme) on the other. In the head
namespace of each, a RAID 0 (64 KiB chunks) over its N members, and
`nvraid bench` (2 workers) alternating between the two beds in each
repetition, for 4K random read and write (QD 32) and 1 MiB sequential read
(QD 8). Reported: the median of the per-repetition ratios NVMe/TCP / NBD.

Usage: sudo bench/san-nvme-vs-nbd.py [--nodes 4] [--reps 3] [--runtime 4]
                                     [--rate 10gbit]
Environment: NVRAID (the binary; default: target/release/nvraid).
"""
import argparse, json, os, statistics, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAN = os.path.join(ROOT, "bench", "san")
NVRAID = os.environ.get("NVRAID", os.path.join(ROOT, "target", "release", "nvraid"))
BEDS = {"nbd": ("nvsanA", "nvraid"), "nvme": ("nvsanB", "nvraid-nvme")}
ROWS = [("randread", "4k", 32), ("randwrite", "4k", 32), ("read", "1M", 8)]


def san(prefix, *args):
    env = dict(os.environ, NVRAID_SAN_PREFIX=prefix, NVRAID=NVRAID)
    r = subprocess.run([SAN, *args], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"bench/san {' '.join(args)} ({prefix}) failed: {r.stderr}")
    return r.stdout


def head(prefix, *args):
    r = subprocess.run(["ip", "netns", "exec", f"{prefix}-head", NVRAID, *args],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"nvraid {' '.join(args)} ({prefix}) failed: {r.stderr}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--runtime", type=int, default=4)
    ap.add_argument("--rate")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (bench/san)")
    uris = {}
    try:
        for kind, (prefix, backend) in BEDS.items():
            san(prefix, "down")
            up = ["up", str(a.nodes), "--backend", backend, "--size", "512M"]
            if a.rate:
                up += ["--rate", a.rate]
            uris[kind] = san(prefix, *up).split()
            head(prefix, "create", "--force", "--level", "0", "--chunk", "64K", *uris[kind])
        for rw, bs, depth in ROWS:
            runs = {"nbd": [], "nvme": []}
            for _ in range(a.reps):
                for kind, (prefix, _) in BEDS.items():
                    out = head(prefix, "bench", "--json", "--rw", rw, "--bs", bs, "--iodepth",
                               str(depth // 2), "--numjobs", "2", "--runtime", f"{a.runtime}s",
                               "--ramp", "1s", "--destructive", *uris[kind])
                    job = json.loads(out)["jobs"][0]
                    d = job["read"] if job["read"]["io_bytes"] > 0 else job["write"]
                    runs[kind].append(d["iops"])
            ratio = statistics.median(n / b for n, b in zip(runs["nvme"], runs["nbd"]))
            print(f"{rw} {bs} QD {depth}: NVMe/TCP {[round(x) for x in runs['nvme']]} IOPS, "
                  f"NBD {[round(x) for x in runs['nbd']]} IOPS: NVMe/TCP / NBD = {ratio:.3f}",
                  flush=True)
    finally:
        for prefix, _ in BEDS.values():
            san(prefix, "down")
    print(f"host: {os.cpu_count()} CPUs, {os.uname().release}; {a.nodes} nodes per bed, "
          f"links {a.rate or 'unshaped'}")


if __name__ == "__main__":
    main()
