#!/usr/bin/env python3
"""Side by side: `nvraid serve --cache none|writeback|journal` under fio's
NBD engine, 4 KiB random writes at QD 32 and 1 MiB sequential writes.
MODES=writeback,journal,journal:32768 adds a mode with md-journal mode's
--cache-stripes-max set.

The array is a RAID 0 of four files in --dir (tmpfs by default) and the
journal a fifth file there, so the journal member is exactly as fast as each
array member. With --level 5 the array is a RAID 5 created with md's write
journal on that fifth file (`create --write-journal`; `serve --journal` on
RAID 4/5/6 would add md's journal to the array all the same): every mode then
logs each write-back through it, and `journal` is md's write-back mode on it
(no --journal). --md-journal is accepted and changes nothing.
Modes alternate within each repetition, each on a freshly started server (the machine is shared and noisy);
the medians and the ratios to writeback are printed, and with --json saved.

    sudo bench/cache-modes.py [--reps 3] [--runtime 5] [--dir DIR] [--journal-dir DIR] [--member-size MIB]
                              [--journal-size MIB]
                              [--level 0|5] [--md-journal] [--json out.json]
"""
import argparse, json, os, shutil, signal, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVRAID = os.environ.get("NVRAID", os.path.join(ROOT, "target", "release", "nvraid"))
JOURNAL = [None]
MD_JOURNAL = [False]
MODES = os.environ.get("MODES", "none,writeback,journal").split(",")
JOBS = {
    "4K randwrite QD32": ["--rw=randwrite", "--bs=4k", "--iodepth=32"],
    "1M write QD8": ["--rw=write", "--bs=1m", "--iodepth=8"],
}


def serve(d, mode):
    # A mode may carry md-journal mode's stripe bound: "journal:32768".
    cache, _, stripes = mode.partition(":")
    sock = os.path.join(d, "md.sock")
    extra = [] if cache == "none" else ["--cache", cache]
    if stripes:
        extra += ["--cache-stripes-max", stripes]
    if cache == "journal" and not MD_JOURNAL[0]:
        extra += ["--journal", JOURNAL[0]]
    log = open(os.path.join(d, f"serve-{mode.replace(':', '-')}.log"), "w")
    members = [os.path.join(d, f"m{i}") for i in range(4)]
    if MD_JOURNAL[0]:
        members.append(JOURNAL[0])
    proc = subprocess.Popen([NVRAID, "serve", "--listen", f"unix:{sock}", *extra, *members],
                            stdout=subprocess.DEVNULL, stderr=log)
    for _ in range(400):
        if os.path.exists(os.path.join(d, "md.ctl")):
            return proc, sock
        time.sleep(0.025)
    proc.kill()
    sys.exit(f"serve --cache {mode} did not start: {open(log.name).read()}")


def stop(proc, d):
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    for name in ("md.ctl", "md.sock"):
        try:
            os.remove(os.path.join(d, name))
        except FileNotFoundError:
            pass


FIO_SIZE = ["900M"]


def fio(sock, args, runtime):
    out = subprocess.run(
        ["fio", "--name=w", "--ioengine=nbd", f"--uri=nbd+unix:///?socket={sock}",
         "--time_based", f"--runtime={runtime}", f"--size={FIO_SIZE[0]}", "--output-format=json", *args],
        capture_output=True, text=True, check=True).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]["write"]
    return job["iops"], job["bw_bytes"] / 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--runtime", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--journal-dir",
                    help="where the journal file goes (default: --dir); e.g. tmpfs in front of disk members")
    ap.add_argument("--level", default="0", choices=["0", "5"])
    ap.add_argument("--md-journal", action="store_true",
                    help="(implied by --level 5) RAID 5 created with md's write journal on the "
                         "journal file")
    ap.add_argument("--dir", default="/dev/shm",
                    help="where the member and journal files go (default tmpfs; a disk directory "
                         "gives members with a device's latency, O_DIRECT)")
    ap.add_argument("--journal-size", type=int, default=256,
                    help="MiB of the journal file (default 256); with --md-journal its ring is all "
                         "of it past 1 MiB, and the cache may hold a fifth of the ring on RAID 5")
    ap.add_argument("--member-size", type=int, default=256,
                    help="MiB per array member (default 256, so the array is smaller than "
                         "writeback's 1 GiB dirty bound; larger shows the sustained rates)")
    a = ap.parse_args()
    data_members = 4 if a.level == "0" else 3
    # fio writes over most of the array (900 MiB of the default 768 or 1024).
    FIO_SIZE[0] = "900M" if a.member_size == 256 else f"{a.member_size * data_members * 9 // 10}M"
    d = tempfile.mkdtemp(prefix="cache-modes-", dir=a.dir)
    try:
        members = [os.path.join(d, f"m{i}") for i in range(4)]
        jdir = tempfile.mkdtemp(prefix="cache-modes-journal-", dir=a.journal_dir or d)
        JOURNAL[0] = os.path.join(jdir, "j")
        with open(JOURNAL[0], "wb") as f:
            f.truncate(a.journal_size << 20)
        if a.md_journal and a.level != "5":
            sys.exit("--md-journal needs --level 5")
        # On RAID 4/5/6 nvraid's journal is md's, kept in the superblocks:
        # every mode is served with it.
        MD_JOURNAL[0] = a.level == "5"
        policy = ["--write-journal", JOURNAL[0]] if MD_JOURNAL[0] else []
        subprocess.run([NVRAID, "create", "--level", a.level, "--size", f"{a.member_size}M", *policy,
                        *members], check=True, capture_output=True)
        # Every page of every file written twice before the first
        # measurement (each file rewritten with its own bytes): on tmpfs the
        # first write to a hole allocates and zeroes a page (`none` ran at
        # 18-47K IOPS in its first repetition, 82-88K after), and the second
        # write to a page moves it to the active LRU list (/proc/vmstat's
        # pgactivate: about one per client write in whichever mode first
        # wrote the pages a second time, none after). Either cost would fall
        # on the first mode measured only.
        for path in [*members, JOURNAL[0]] * 2:
            fd = os.open(path, os.O_RDWR)
            try:
                size, at = os.fstat(fd).st_size, 0
                while at < size:
                    block = os.pread(fd, 4 << 20, at)
                    os.pwrite(fd, block, at)
                    at += len(block)
            finally:
                os.close(fd)
        results = {job: {m: [] for m in MODES} for job in JOBS}
        # Each measurement starts a fresh server: an empty cache, and the
        # previous job's dirty data already on the members.
        for rep in range(a.reps):
            for job, args in JOBS.items():
                for mode in MODES:
                    proc, sock = serve(d, mode)
                    try:
                        iops, mb = fio(sock, args, a.runtime)
                    finally:
                        stop(proc, d)
                    results[job][mode].append((iops, mb))
                    print(f"rep {rep} {mode:9} {job}: {iops:9.0f} IOPS {mb:8.1f} MB/s", flush=True)
        summary = {}
        for job in JOBS:
            med = {m: statistics.median(r[0] for r in results[job][m]) for m in MODES}
            summary[job] = {m: {"iops_median": med[m], "vs_writeback": med[m] / med["writeback"]}
                            for m in MODES}
            print(f"{job}: " + ", ".join(
                f"{m} {med[m]:.0f} IOPS ({med[m] / med['writeback']:.2f}x writeback)" for m in MODES))
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"runs": results, "summary": summary}, f, indent=1)
    finally:
        shutil.rmtree(d, ignore_errors=True)
        if JOURNAL[0]:
            shutil.rmtree(os.path.dirname(JOURNAL[0]), ignore_errors=True)


if __name__ == "__main__":
    main()
