#!/usr/bin/env python3
"""RAID 5 and RAID 6 next to fio on the same members, in one run (issue 11's
targets).

Four members (zram block devices when root and zram is available, else files
on /dev/shm), filled with random data. For each level, an array is created
over them and resynced (`nvraid repair`: the members held other bytes, so
parity is computed first, and the array's writes may then read-modify-write).
Then, alternating nvraid and fio (the members as JBOD, best of io_uring and
psync, at the same total queue depth and worker count):

  1 MiB sequential write, QD 8, 2 workers    target >= 0.9 x (N-p)/N
  4K random write, QD 32, 2 workers          target >= 0.9 / 4 (RAID 5), / 6 (RAID 6)
  4K random read, QD 32, 2 workers           target >= 1.0
  4K random read, one member missing         target >= 0.6 (of fio on all members)

and the rebuild of a lost member on the idle array next to fio's sequential
write of that member alone (target >= 0.9). Then RAID 5 again with md's
partial parity log (--consistency-policy ppl) instead of the bitmap, and
with md's write journal on a fifth member (--write-journal; a 256 MiB file
on /dev/shm, a journal device faster than the members), for the two write
workloads: what closing the write hole costs each way.

Usage: bench/parity-vs-fio.py [--reps 3] [--runtime 5] [--json out.json]
"""
import argparse, importlib.util, json, os, shutil, statistics, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("vsfio", os.path.join(ROOT, "bench", "vs-fio.py"))
vsfio = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vsfio)
sh, fio, nvraid, NVRAID = vsfio.sh, vsfio.fio, vsfio.nvraid, vsfio.NVRAID
MEMBER_BYTES = vsfio.MEMBER_BYTES


def best_fio(tmp, devs, rw, bs, depth, jobs, runtime):
    u = fio(tmp, devs, rw, bs, depth, jobs, runtime, "io_uring")
    p = fio(tmp, devs, rw, bs, depth, jobs, runtime, "psync")
    return max(u, p, key=lambda r: r["iops"])


def rebuild_vs_fio(tmp, kind, devs, level):
    """Lose the last member, add it back empty, time nvraid's rebuild;
    then fio writes the same member sequentially for as many bytes."""
    new = devs[-1]
    reset(kind, new)
    report = json.loads(sh([NVRAID, "add", "--force", "--json", "--new", new, *devs[:-1]]).stdout)
    r = report["rebuilt"][0]
    reset(kind, new)
    out = f"{tmp}/fio-rebuild.json"
    sh(["fio", "--name=seq", f"--filename={new}", "--rw=write", "--bs=1M", "--direct=1",
        "--ioengine=psync", "--offset=1M", f"--size={r['bytes']}", "--refill_buffers",
        "--buffer_compress_percentage=0", "--output-format=json", f"--output={out}"])
    with open(out) as f:
        fio_rate = json.load(f)["jobs"][0]["write"]["bw_bytes"]
    return r["rate_bytes_per_second"], fio_rate


def reset(kind, dev):
    """Empty a member, as a fresh drive."""
    if kind == "zram":
        n = dev.removeprefix("/dev/zram")
        with open(f"/sys/block/zram{n}/reset", "w") as f:
            f.write("1")
        with open(f"/sys/block/zram{n}/disksize", "w") as f:
            f.write(str(MEMBER_BYTES))
    else:
        with open(dev, "wb") as f:
            f.truncate(0)
            f.truncate(MEMBER_BYTES)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--runtime", type=int, default=5)
    ap.add_argument("--levels", default="5,6,5ppl,5jrnl")
    ap.add_argument("--json")
    a = ap.parse_args()
    vsfio.ensure_tools()
    tmp = tempfile.mkdtemp(prefix="parity-vs-fio-")
    kind, devs = vsfio.setup_members(tmp, "auto")
    n = len(devs)
    results = {"members": kind, "count": n, "rows": []}
    print(f"members: {n} x {MEMBER_BYTES >> 20} MiB {kind}; runtime {a.runtime}s; "
          f"{a.reps} repetitions", flush=True)
    try:
        journal = os.path.join("/dev/shm", f"nvraid-parity-journal-{os.getpid()}")
        for level in a.levels.split(","):
            ppl = level.endswith("ppl")
            jrnl = level.endswith("jrnl")
            level = level.removesuffix("ppl").removesuffix("jrnl")
            p = 1 if level == "5" else 2
            policy = ["--consistency-policy", "ppl"] if ppl else []
            array = list(devs)
            if jrnl:
                with open(journal, "wb") as f:
                    f.truncate(256 << 20)
                policy = ["--write-journal", journal]
                array.append(journal)
            sh([NVRAID, "create", "--level", level, "--force", *policy, *devs])
            sh([NVRAID, "repair", *array])
            workloads = [
                ("1 MiB sequential write, QD 8, 2 workers", "write", "1M", 8, 2,
                 0.9 * (n - p) / n, devs),
                ("4K random write, QD 32, 2 workers", "randwrite", "4k", 32, 2,
                 0.9 / (4 if p == 1 else 6), devs),
                ("4K random read, QD 32, 2 workers", "randread", "4k", 32, 2, 1.0, devs),
                ("4K random read, one member missing", "randread", "4k", 32, 2, 0.6, devs[:-1]),
            ]
            if ppl or jrnl:
                workloads = [w[:6] + (array,) for w in workloads[:2]]
                level = level + (" with PPL" if ppl else " with md's journal")
            for name, rw, bs, depth, jobs, target, members in workloads:
                pairs, runs = [], []
                extra = ["--degraded"] if len(members) < len(array) else []
                for rep in range(a.reps):
                    got = {}
                    for who in (["fio", "nvraid"] if rep % 2 == 0 else ["nvraid", "fio"]):
                        if who == "fio":
                            got["fio"] = best_fio(tmp, devs, rw, bs, depth, jobs, a.runtime)
                        else:
                            got["nvraid"] = nvraid(members, rw, bs, depth, jobs, a.runtime, extra)
                    pairs.append((got["nvraid"]["iops"], got["fio"]["iops"]))
                    runs.append(got)
                ratios = [x / y for x, y in pairs]
                row = {"level": level, "workload": name, "target": target,
                       "ratio_median": statistics.median(ratios), "ratios": ratios, "runs": runs}
                results["rows"].append(row)
                print(f"raid{level} {name}: nvraid/fio = {row['ratio_median']:.3f} "
                      f"(target >= {target:.3f}) runs {[round(r, 3) for r in ratios]} "
                      f"nvraid {[round(r['nvraid']['iops']) for r in runs]} "
                      f"fio {[round(r['fio']['iops']) for r in runs]} IOPS", flush=True)
            if ppl or jrnl:
                continue
            # The degraded reads above wrote nothing: the array is whole
            # again for the rebuild.
            rates = [rebuild_vs_fio(tmp, kind, devs, level) for _ in range(a.reps)]
            ratios = [r / f for r, f in rates]
            row = {"level": level, "workload": "idle rebuild of one member vs fio sequential write",
                   "target": 0.9, "ratio_median": statistics.median(ratios), "ratios": ratios,
                   "rates": rates}
            results["rows"].append(row)
            print(f"raid{level} {row['workload']}: {row['ratio_median']:.3f} (target >= 0.9) runs "
                  f"{[round(r, 3) for r in ratios]} MB/s {[(round(r / 1e6), round(f / 1e6)) for r, f in rates]}",
                  flush=True)
    finally:
        vsfio.teardown(kind, devs)
        if os.path.exists(journal):
            os.remove(journal)
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
