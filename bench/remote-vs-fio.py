#!/usr/bin/env python3
"""RAID 0 over NBD members next to fio's nbd engine on the same exports, in
one run (issue 13's first target).

Four nbdkit servers (memory plugin, unix sockets, 1 GiB each) are the
members. An nvraid RAID 0 (64 KiB chunks unless --chunk) is created over them, then,
alternating in each repetition:

  fio, ioengine=nbd (libnbd), one job per export (the exports as JBOD),
      each job at QD/4, skipping each export's first MiB (the array's
      superblock area; the array's data starts there too)
  nvraid bench on the array, 2 workers (--workers) sharing the queue depth

for 4K random read (target >= 1.0), 4K random write (>= 0.95) and 1 MiB
sequential read (>= 0.98), at a total queue depth of 32 (8 for 1 MiB).
Reported: the median of the per-repetition ratios nvraid / fio. fio's jobs
are reported per export, and their spread (fastest / slowest export) is
printed: where fio starved one export, its total measured a different load
from a RAID 0's, and the median over the even repetitions is shown beside
the verdict (for reading; the verdict uses every repetition).

Usage: bench/remote-vs-fio.py [--reps 3] [--runtime 5] [--rows randread,randwrite,read]
                              [--workers 2] [--chunk 64K] [--json out.json]
"""
import argparse, importlib.util, json, os, shutil, signal, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("vsfio", os.path.join(ROOT, "bench", "vs-fio.py"))
vsfio = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vsfio)
sh, nvraid, summarize, NVRAID = vsfio.sh, vsfio.nvraid, vsfio.summarize, vsfio.NVRAID

EXPORTS = 4
EXPORT_SIZE = "1G"


def start_nodes(tmp):
    nodes = []
    for i in range(EXPORTS):
        sock = f"{tmp}/node{i}.sock"
        p = subprocess.Popen(["nbdkit", "-f", "-U", sock, "memory", f"size={EXPORT_SIZE}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        nodes.append((p, sock))
    for _, sock in nodes:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.02)
    return nodes


def fio_nbd(tmp, uris, rw, bs, total_depth, runtime):
    out = f"{tmp}/fio.json"
    cmd = ["fio", "--ioengine=nbd", f"--rw={rw}", f"--bs={bs}",
           f"--iodepth={max(1, total_depth // len(uris))}", "--time_based",
           f"--runtime={runtime}", "--ramp_time=1", "--norandommap",
           "--randrepeat=0", "--offset=1M", "--output-format=json", f"--output={out}"]
    for i, uri in enumerate(uris):
        cmd += [f"--name=export{i}", f"--uri={uri}"]
    sh(cmd)
    with open(out) as f:
        jobs = [summarize(job) for job in json.load(f)["jobs"]]
    # Per export, not grouped: on this shared 2-core machine fio's jobs are
    # often scheduled unevenly (one export starved while the others run
    # faster), and the total then measures a different load than a RAID 0,
    # which keeps every member equally busy. The spread says when.
    total = {"iops": sum(j["iops"] for j in jobs), "bw_bytes": sum(j["bw_bytes"] for j in jobs),
             "p50_ns": max((j["p50_ns"] or 0) for j in jobs),
             "cpu_cores": sum(j["cpu_cores"] for j in jobs)}
    per = [j["iops"] for j in jobs]
    total["job_iops"] = per
    total["spread"] = max(per) / max(min(per), 1e-9)
    return total


ROWS = [
    ("4K random read", "randread", "4k", 32, 1.0),
    ("4K random write", "randwrite", "4k", 32, 0.95),
    ("1 MiB sequential read", "read", "1M", 8, 0.98),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--runtime", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--workers", type=int, default=2,
                    help="nvraid bench's workers (the total queue depth is split among them)")
    ap.add_argument("--chunk", default="64K",
                    help="the array's chunk size (nvraid create --chunk)")
    ap.add_argument("--rows", default="randread,randwrite,read",
                    help="which workloads (fio --rw names), comma-separated")
    a = ap.parse_args()
    for tool in ("nbdkit", "fio"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is missing (./test.sh installs the peers)")
    tmp = tempfile.mkdtemp(prefix="remote-vs-fio-")
    nodes = start_nodes(tmp)
    uris = [f"nbd+unix:///?socket={sock}" for _, sock in nodes]
    results = {"exports": f"{EXPORTS} x nbdkit memory {EXPORT_SIZE} (unix sockets)",
               "chunk": a.chunk, "rows": []}
    try:
        sh([NVRAID, "create", "--level", "0", "--chunk", a.chunk, *uris])
        # Write the data area once, so reads are of written memory on both sides.
        sh(["fio", "--ioengine=nbd", "--rw=write", "--bs=1M", "--iodepth=8", "--offset=1M",
            *[x for i, u in enumerate(uris) for x in (f"--name=fill{i}", f"--uri={u}")],
            "--output-format=json", f"--output={tmp}/fill.json"])
        for label, rw, bs, depth, target in ROWS:
            if rw not in a.rows.split(","):
                continue
            pairs = []
            for _ in range(a.reps):
                f = fio_nbd(tmp, uris, rw, bs, depth, a.runtime)
                n = nvraid(uris, rw, bs, max(1, depth // a.workers), a.workers, a.runtime)
                pairs.append((n, f))
                print(f"  {label}: nvraid {n['iops']:.0f} IOPS {n['bw_bytes']/1e6:.0f} MB/s"
                      f" | fio {f['iops']:.0f} IOPS {f['bw_bytes']/1e6:.0f} MB/s"
                      f" (exports max/min {f['spread']:.1f}x)"
                      f" | {n['iops']/f['iops']:.3f}", flush=True)
            ratio = vsfio.median_ratio([(n["iops"], f["iops"]) for n, f in pairs])
            verdict = "met" if ratio >= target else "MISSED"
            print(f"{label}: nvraid/fio = {ratio:.3f} (target >= {target}) {verdict}", flush=True)
            # For reading, not for the verdict: the repetitions in which fio
            # kept its four exports within 2x of each other.
            even = [(n["iops"], f["iops"]) for n, f in pairs if f["spread"] <= 2.0]
            even_ratio = vsfio.median_ratio(even) if even else None
            if even_ratio is not None:
                print(f"  (repetitions with fio's exports within 2x: {len(even)} of {len(pairs)},"
                      f" median ratio {even_ratio:.3f})", flush=True)
            results["rows"].append({"workload": label, "ratio": ratio, "target": target,
                                    "even_ratio": even_ratio, "even_reps": len(even),
                                    "pairs": [{"nvraid": n, "fio": f} for n, f in pairs]})
    finally:
        for p, _ in nodes:
            p.send_signal(signal.SIGTERM)
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
