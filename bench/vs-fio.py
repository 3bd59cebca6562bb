#!/usr/bin/env python3
"""nvraid bench next to fio, in one run, on the same members.

Sets up 4 members (zram block devices when root and zram is available,
otherwise files on /dev/shm), fills them with random data, creates an nvraid
RAID 0 over them, and for each workload runs, alternating, fio on the 4
members as JBOD (best of its io_uring and psync engines) and nvraid bench on
the RAID 0, with the same total queue depth and worker count. Reports the
ratio nvraid / fio per repetition and the median.

fio writes a fixed random buffer (--scramble_buffers=0), as nvraid does: on a
compressing member (zram) the data written changes the cost of a write
several-fold, so both tools must write the same kind of data.

Also: null-member throughput per core against fio's null engine, the
2-worker / 1-worker scaling on null members, and nvraid bench on ONE raw
member against fio on the same member and job (IOPS, bandwidth, p50).

Usage: bench/vs-fio.py [--reps 3] [--runtime 5] [--json out.json]
Needs root for zram; installs fio with apt-get when missing.
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVRAID = os.environ.get("NVRAID", os.path.join(ROOT, "target", "release", "nvraid"))
MEMBER_BYTES = 1 << 30


def sh(cmd, **kw):
    done = subprocess.run(cmd, text=True, capture_output=True, **kw)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
    return done


def ensure_tools():
    if shutil.which("fio") is None:
        subprocess.run(["apt-get", "install", "-y", "-qq", "fio"], check=True)
    sh(["cargo", "build", "--release", "-p", "nvraid"], cwd=ROOT)


def setup_members(tmp, want):
    """Four members: zram devices if possible (or asked), else /dev/shm files."""
    zram_ok = os.geteuid() == 0 and os.path.exists("/sys/class/zram-control/hot_add")
    if want == "zram" and not zram_ok:
        sys.exit("zram members need root and the zram module")
    if want != "tmpfs" and zram_ok:
        devs = []
        for _ in range(4):
            with open("/sys/class/zram-control/hot_add") as f:
                n = f.read().strip()
            with open(f"/sys/block/zram{n}/disksize", "w") as f:
                f.write(str(MEMBER_BYTES))
            devs.append(f"/dev/zram{n}")
        kind = "zram"
    else:
        devs = []
        for i in range(4):
            path = os.path.join("/dev/shm", f"nvraid-vsfio-{os.getpid()}-{i}")
            with open(path, "wb") as f:
                f.truncate(MEMBER_BYTES)
            devs.append(path)
        kind = "tmpfs"
    for d in devs:  # real data, so reads are not of empty pages
        sh(["fio", "--name=fill", f"--filename={d}", "--rw=write", "--bs=1M", "--direct=1",
            "--ioengine=psync", f"--size={MEMBER_BYTES}", "--buffer_compress_percentage=0",
            "--refill_buffers", f"--output={tmp}/fill.txt"])
    sh([NVRAID, "create", "--level", "0", "--force", *devs])  # the script owns these members
    return kind, devs


def teardown(kind, devs):
    for d in devs:
        if kind == "zram":
            n = d.removeprefix("/dev/zram")
            try:
                with open("/sys/class/zram-control/hot_remove", "w") as f:
                    f.write(n)
            except OSError:
                pass
        else:
            os.unlink(d)


def fio(tmp, files, rw, bs, depth, jobs, runtime, engine, extra=("--offset=1M",)):
    """fio on the members as JBOD. By default it skips each member's first
    MiB, where the array's superblock lives (the array's data area starts
    there too, so both tools address the same bytes)."""
    out = f"{tmp}/fio.json"
    sh(["fio", "--name=job", f"--filename={':'.join(files)}", f"--rw={rw}", f"--bs={bs}",
        f"--iodepth={depth}", f"--numjobs={jobs}", f"--ioengine={engine}", "--direct=1",
        "--time_based", f"--runtime={runtime}", "--ramp_time=1", "--group_reporting",
        "--norandommap", "--randrepeat=0", "--scramble_buffers=0",
        "--output-format=json", f"--output={out}", *extra])
    with open(out) as f:
        return summarize(json.load(f)["jobs"][0])


def nvraid(members, rw, bs, depth, jobs, runtime, extra=()):
    out = sh([NVRAID, "bench", "--json", "--rw", rw, "--bs", bs, "--iodepth", str(depth),
              "--numjobs", str(jobs), "--runtime", f"{runtime}s", "--ramp", "1s", "--destructive",
              *extra, *members]).stdout
    return summarize(json.loads(out)["jobs"][0])


def summarize(job):
    d = job["read"] if job["read"]["io_bytes"] > 0 else job["write"]
    pct = d["clat_ns"].get("percentile", {})
    cpu_cores = (job["usr_cpu"] + job["sys_cpu"]) / 100.0
    return {"iops": d["iops"], "bw_bytes": d["bw_bytes"], "p50_ns": pct.get("50.000000"),
            "cpu_cores": cpu_cores}


def median_ratio(pairs):
    return statistics.median(a / b for a, b in pairs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--runtime", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--members", choices=["auto", "zram", "tmpfs"], default="auto",
                    help="member kind (auto: zram when root and available)")
    a = ap.parse_args()
    ensure_tools()
    tmp = tempfile.mkdtemp(prefix="vs-fio-")
    kind, devs = setup_members(tmp, a.members)
    results = {"members": kind, "rows": []}
    print(f"members: 4 x {MEMBER_BYTES >> 20} MiB {kind}; runtime {a.runtime}s; {a.reps} repetitions", flush=True)
    try:
        workloads = [
            ("4K random read, QD 32, 2 workers", "randread", "4k", 32, 2, 1.00),
            ("4K random write, QD 32, 2 workers", "randwrite", "4k", 32, 2, 0.95),
            ("1 MiB sequential read, QD 8, 2 workers", "read", "1M", 8, 2, 0.98),
        ]
        for name, rw, bs, depth, jobs, target in workloads:
            pairs, detail = [], []
            for rep in range(a.reps):
                order = ["fio", "nvraid"] if rep % 2 == 0 else ["nvraid", "fio"]
                got = {}
                for who in order:
                    if who == "fio":
                        u = fio(tmp, devs, rw, bs, depth, jobs, a.runtime, "io_uring")
                        p = fio(tmp, devs, rw, bs, depth, jobs, a.runtime, "psync")
                        got["fio"] = max(u, p, key=lambda r: r["iops"])
                        got["fio_engine"] = "io_uring" if got["fio"] is u else "psync"
                    else:
                        got["nvraid"] = nvraid(devs, rw, bs, depth, jobs, a.runtime)
                pairs.append((got["nvraid"]["iops"], got["fio"]["iops"]))
                detail.append(got)
            row = {"workload": name, "target": target, "ratio_median": median_ratio(pairs),
                   "ratios": [x / y for x, y in pairs], "runs": detail}
            results["rows"].append(row)
            print(f"{name}: nvraid/fio = {row['ratio_median']:.3f} (target >= {target}) "
                  f"runs {[round(r, 3) for r in row['ratios']]}", flush=True)

        # null members: the engine itself.
        nulls = ["null:8G"] * 4
        pairs = []
        for rep in range(a.reps):
            n = nvraid(nulls, "randread", "4k", 32, 1, a.runtime, ["--level", "0"])
            f = fio(tmp, ["nvraid-null"], "randread", "4k", 32, 1, a.runtime, "null", ["--size=32G"])
            pairs.append((n["iops"] / max(n["cpu_cores"], 1e-9), f["iops"] / max(f["cpu_cores"], 1e-9)))
        row = {"workload": "4K random read on null members, IOPS per core vs fio null engine",
               "target": 2.0, "ratio_median": median_ratio(pairs), "pairs": pairs}
        results["rows"].append(row)
        print(f"{row['workload']}: {row['ratio_median']:.3f} (target >= 2.0) {pairs}", flush=True)

        pairs = []
        for rep in range(a.reps):
            one = nvraid(nulls, "randread", "4k", 32, 1, a.runtime, ["--level", "0"])
            two = nvraid(nulls, "randread", "4k", 32, 2, a.runtime, ["--level", "0"])
            pairs.append((two["iops"], one["iops"]))
        row = {"workload": "null members: 2 workers / 1 worker", "target": 1.9,
               "ratio_median": median_ratio(pairs), "pairs": pairs}
        results["rows"].append(row)
        print(f"{row['workload']}: {row['ratio_median']:.3f} (target >= 1.9)", flush=True)

        # One raw member, same engine, same job: the benchmark's honesty.
        for rw, bs, depth in [("randread", "4k", 32), ("read", "1M", 8)]:
            for engine in ["io_uring", "psync"]:
                flag = "uring" if engine == "io_uring" else "psync"
                iops, bw, p50 = [], [], []
                for rep in range(a.reps):
                    n = nvraid([devs[0]], rw, bs, depth, 1, a.runtime, ["--raw", "--engine", flag])
                    f = fio(tmp, [devs[0]], rw, bs, depth, 1, a.runtime, engine)
                    iops.append((n["iops"], f["iops"]))
                    bw.append((n["bw_bytes"], f["bw_bytes"]))
                    p50.append((n["p50_ns"], f["p50_ns"]))
                row = {"workload": f"one raw member, {rw} {bs} QD {depth}, {engine}",
                       "iops_ratio": median_ratio(iops), "bw_ratio": median_ratio(bw),
                       "p50_ratio": median_ratio(p50), "iops": iops, "p50": p50}
                results["rows"].append(row)
                print(f"{row['workload']}: IOPS {row['iops_ratio']:.3f} bw {row['bw_ratio']:.3f} "
                      f"p50 {row['p50_ratio']:.3f} (targets 1±0.03, 1±0.03, 1±0.10)", flush=True)
    finally:
        teardown(kind, devs)
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
