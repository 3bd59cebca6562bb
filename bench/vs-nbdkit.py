#!/usr/bin/env python3
"""nvraid serve next to nbdkit, through fio's nbd engine, in one run.

(a) `nvraid serve` of a RAID 0 over 4 tmpfs files and (b) nbdkit's file
plugin serving one tmpfs file of the same total size; both filled with
random data first. Workloads over 4 connections (fio numjobs=4; --jobs N
for another count): 4K random read and write at QD 32, 1 MiB sequential
read at QD 8. Alternating repetitions; prints the ratio nvraid / nbdkit per
repetition and the median. Targets (issue 13): >= 1.5 on random I/O,
>= 1.1 sequential.

Usage: bench/vs-nbdkit.py [--reps 3] [--runtime 5] [--jobs 4] [--json out.json]
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVRAID = os.environ.get("NVRAID", os.path.join(ROOT, "target", "release", "nvraid"))
MEMBER_MIB = 256


def sh(cmd, **kw):
    done = subprocess.run(cmd, text=True, capture_output=True, **kw)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
    return done


def wait_socket(path):
    for _ in range(200):
        if os.path.exists(path):
            return
        time.sleep(0.05)
    sys.exit(f"{path} did not appear")


def fio(uri, out, rw, bs, depth, runtime, jobs):
    sh(["fio", "--name=job", "--ioengine=nbd", f"--uri={uri}", f"--numjobs={jobs}", "--group_reporting",
        "--time_based", f"--runtime={runtime}", "--ramp_time=1", f"--rw={rw}", f"--bs={bs}",
        f"--iodepth={depth}", "--norandommap", "--randrepeat=0", f"--size={4 * MEMBER_MIB - 8}M",
        "--output-format=json", f"--output={out}"])
    with open(out) as f:
        job = json.load(f)["jobs"][0]
    return job["read"]["iops"] + job["write"]["iops"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--runtime", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=4, help="fio numjobs: one connection each")
    ap.add_argument("--json")
    a = ap.parse_args()
    for tool in ["fio", "nbdkit", "nbdcopy"]:
        if shutil.which(tool) is None:
            subprocess.run(["apt-get", "install", "-y", "-qq", "fio", "nbdkit", "libnbd-bin"], check=True)
    sh(["cargo", "build", "--release", "-p", "nvraid"], cwd=ROOT)
    work = tempfile.mkdtemp(prefix="vs-nbdkit-", dir="/dev/shm")
    procs = []
    try:
        members = [os.path.join(work, f"m{i}") for i in range(4)]
        sh([NVRAID, "create", "--level", "0", "--size", f"{MEMBER_MIB}M", *members])
        single = os.path.join(work, "single.img")
        with open(single, "wb") as f:
            f.truncate(4 * MEMBER_MIB << 20)
        nv_sock, kit_sock = os.path.join(work, "nvraid.sock"), os.path.join(work, "nbdkit.sock")
        procs.append(subprocess.Popen([NVRAID, "serve", "--listen", f"unix:{nv_sock}", *members],
                                      stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen(["nbdkit", "--foreground", "--unix", kit_sock, "file", single]))
        wait_socket(nv_sock)
        wait_socket(kit_sock)
        uris = {"nvraid": f"nbd+unix:///?socket={nv_sock}", "nbdkit": f"nbd+unix:///?socket={kit_sock}"}
        noise = os.path.join(work, "noise.bin")
        with open(noise, "wb") as f:
            for _ in range(4 * MEMBER_MIB - 8):
                f.write(os.urandom(1 << 20))
        for uri in uris.values():
            sh(["nbdcopy", noise, uri])
        os.unlink(noise)
        print(f"nvraid: RAID 0 of 4 x {MEMBER_MIB} MiB tmpfs files; nbdkit: one file of {4 * MEMBER_MIB} MiB "
              f"on tmpfs; {a.jobs} connection(s); {a.runtime}s runs", flush=True)
        rows = []
        for name, rw, bs, depth, target in [("4K random read, QD 32", "randread", "4k", 32, 1.5),
                                             ("4K random write, QD 32", "randwrite", "4k", 32, 1.5),
                                             ("1 MiB sequential read, QD 8", "read", "1M", 8, 1.1)]:
            ratios = []
            for rep in range(a.reps):
                order = ["nbdkit", "nvraid"] if rep % 2 == 0 else ["nvraid", "nbdkit"]
                got = {who: fio(uris[who], os.path.join(work, "fio.json"), rw, bs, depth, a.runtime, a.jobs) for who in order}
                ratios.append(got["nvraid"] / got["nbdkit"])
                print(f"  {name}: nvraid {got['nvraid']:.0f} IOPS | nbdkit {got['nbdkit']:.0f} IOPS | "
                      f"{ratios[-1]:.3f}", flush=True)
            row = {"workload": name, "target": target, "ratio_median": statistics.median(ratios), "ratios": ratios}
            rows.append(row)
            print(f"{name}: nvraid/nbdkit = {row['ratio_median']:.3f} (target >= {target}) "
                  f"runs {[round(r, 3) for r in ratios]}", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)
    finally:
        for p in procs:
            p.terminate()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
