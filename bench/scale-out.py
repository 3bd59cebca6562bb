#!/usr/bin/env python3
"""Scale-out on the storage-network bed (bench/san): RAID 0 and RAID 10 over
1, 2, 4 and 8 remote nodes, measured at the head, next to what
`nvraid topology --plan` predicts from the nodes' links (issue 13).

For each node count the bed comes up with every link shaped (tc tbf, both
directions, --rate), an array is created over the nodes' NBD exports in the
head namespace, and nvraid bench runs there:

  1 MiB sequential read, 2 workers x QD 8   -> MB/s, next to the plan's
                                               read ceiling (ratio; the
                                               target is within 10%), and
                                               next to the sum of the links'
                                               line rates (target >= 0.9)
  4K random read, 2 workers x QD 16         -> IOPS

Every array is first filled with random bytes through nvraid (a server
may answer reads of space never written with holes, sending no data).

Usage: sudo bench/scale-out.py [--nodes 1,2,4,8] [--rate 1gbit] [--runtime 4]
                               [--backend nbdkit] [--size 256M] [--json out.json]
"""
import argparse, json, os, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAN = os.path.join(ROOT, "bench", "san")
NVRAID = os.environ.get("NVRAID", os.path.join(ROOT, "target", "release", "nvraid"))


def sh(*cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr}")
    return r.stdout


def head(*cmd):
    return sh(SAN, "exec", *cmd)


def bits(rate):
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}
    for u, scale in units.items():
        if rate.endswith(u):
            return float(rate[: -len(u)]) * scale
    sys.exit(f"rate {rate!r}: use kbit, mbit or gbit")


def fill(uris):
    """Write random bytes over the whole array once: a server that answers
    reads of never-written (sparse) space with holes (qemu-nbd does, with
    structured replies) would send no data, and the figures would be
    fiction."""
    detail = json.loads(head(NVRAID, "detail", "--json", *uris))
    size = detail["size_bytes"]
    source = subprocess.Popen(["head", "-c", str(size), "/dev/urandom"], stdout=subprocess.PIPE)
    r = subprocess.run([SAN, "exec", NVRAID, "write", *uris], stdin=source.stdout,
                       capture_output=True, text=True)
    source.wait()
    if r.returncode != 0:
        sys.exit(f"filling the array failed:\n{r.stderr}")


def bench(uris, rw, bs, depth, runtime):
    out = head(NVRAID, "bench", "--json", "--rw", rw, "--bs", bs, "--iodepth", str(depth),
               "--numjobs", "2", "--runtime", f"{runtime}s", "--ramp", "1s", *uris)
    job = json.loads(out)["jobs"][0]["read"]
    return job["bw_bytes"], job["iops"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="1,2,4,8")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--runtime", type=int, default=4)
    ap.add_argument("--backend", default="nbdkit")
    ap.add_argument("--size", default="256M", help="each node's export")
    ap.add_argument("--json")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("scale-out: needs root (bench/san)")
    rows = []
    print(f"links: {a.rate} each (tc tbf); backend {a.backend}; nvraid bench, 2 workers")
    print(f"{'nodes':>5} {'level':>7} {'seq MB/s':>9} {'plan MB/s':>9} {'meas/plan':>9} "
          f"{'of links':>8} {'4K IOPS':>9}")
    for n in [int(x) for x in a.nodes.split(",")]:
        sh(SAN, "down")
        sh(SAN, "up", str(n), "--rate", a.rate, "--backend", a.backend, "--size", a.size)
        try:
            uris = sh(SAN, "uris").split()
            for level in ("0", "10"):
                if level == "10" and n < 2:
                    continue
                head(NVRAID, "create", "--force", "--level", level, "--chunk", "64K", *uris)
                fill(uris)
                plan = json.loads(head(NVRAID, "topology", "--json", "--plan", "--level",
                                       level, *uris))["plan"]
                predicted = plan["read"]["bytes_per_sec"]
                seq, _ = bench(uris, "read", "1M", 8, a.runtime)
                _, iops = bench(uris, "randread", "4k", 16, a.runtime)
                links = n * bits(a.rate) / 8
                row = {"nodes": n, "level": int(level), "seq_bytes_per_sec": seq,
                       "predicted_bytes_per_sec": predicted, "links_bytes_per_sec": links,
                       "randread_iops": iops}
                rows.append(row)
                print(f"{n:>5} {'RAID ' + level:>7} {seq / 1e6:>9.0f} {predicted / 1e6:>9.0f} "
                      f"{seq / predicted:>9.3f} {seq / links:>8.3f} {iops:>9.0f}", flush=True)
        finally:
            sh(SAN, "down")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rate": a.rate, "backend": a.backend, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
