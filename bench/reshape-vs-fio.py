#!/usr/bin/env python3
"""Speed of an idle RAID 5 grow from 4 to 5 members next to fio's sequential
write bandwidth of one member alone, alternating, in one run (issue 33).

For each repetition (after one warm-up round that is not counted): a RAID 5
of four blank members is created, filled with random bytes through
`nvraid write` (so zram cannot compress them away) and resynced (`nvraid
repair`: a block device is not known to hold zeros), a fifth blank member
is added with `nvraid grow -n 5 --add`
(timed by nvraid's own --json report: array bytes moved / seconds); then fio
writes the fifth member sequentially (1 MiB, psync, direct) for one member's
data size. The ratio is grow rate / fio rate (target >= 0.5: each array byte
is read once and written once, plus its share of parity).

Members are zram devices when run as root with zram available (O_DIRECT
block devices), else files on /dev/shm.

The issue's second target, a client's 4K random reads during a reshape
against none, is bench/online-grow-read.py's.

With `--compare OLD`, every repetition also grows the same array with the
binary OLD (before the binary measured, in the same round, so that both
meet the same load): each binary's ratio is reported, and new/old.

Usage: bench/reshape-vs-fio.py [--reps 3] [--mib 256] [--bitmap none|internal]
                               [--step 16M] [--compare OLD] [--json out.json]
NVRAID=path picks the binary (default target/release/nvraid, built first).
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVRAID = os.environ.get("NVRAID")


def sh(cmd, **kw):
    done = subprocess.run(cmd, text=True, capture_output=True, **kw)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
    return done


class Members:
    def __init__(self, count, size):
        self.zram = os.geteuid() == 0 and os.path.exists("/sys/class/zram-control/hot_add")
        self.size = size
        self.paths = []
        for i in range(count):
            if self.zram:
                with open("/sys/class/zram-control/hot_add") as f:
                    n = f.read().strip()
                self.paths.append(f"/dev/zram{n}")
            else:
                self.paths.append(f"/dev/shm/nvraid-reshape-{os.getpid()}-{i}")
            self.reset(self.paths[-1])

    def reset(self, path):
        """Empty a member (as a fresh drive)."""
        if self.zram:
            n = path.removeprefix("/dev/zram")
            with open(f"/sys/block/zram{n}/reset", "w") as f:
                f.write("1")
            with open(f"/sys/block/zram{n}/disksize", "w") as f:
                f.write(str(self.size))
        else:
            with open(path, "wb") as f:
                f.truncate(self.size)

    def close(self):
        for p in self.paths:
            if self.zram:
                try:
                    with open("/sys/class/zram-control/hot_remove", "w") as f:
                        f.write(p.removeprefix("/dev/zram"))
                except OSError:
                    pass
            else:
                os.unlink(p)


def fio_write(path, offset, size, out):
    sh(["fio", "--name=seq", f"--filename={path}", "--rw=write", "--bs=1M", "--direct=1",
        "--ioengine=psync", f"--offset={offset}", f"--size={size}", "--refill_buffers",
        "--buffer_compress_percentage=0", "--output-format=json", f"--output={out}"])
    with open(out) as f:
        return json.load(f)["jobs"][0]["write"]["bw_bytes"]


def main():
    global NVRAID
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mib", type=int, default=256, help="member size in MiB")
    ap.add_argument("--bitmap", default="internal", choices=["none", "internal"])
    ap.add_argument("--step", default="16M", help="nvraid grow --step")
    ap.add_argument("--compare", metavar="OLD", help="also grow with this binary, alternating")
    ap.add_argument("--json")
    args = ap.parse_args()
    if shutil.which("fio") is None:
        subprocess.run(["apt-get", "install", "-y", "-qq", "fio"], check=True)
    if NVRAID is None:
        sh(["cargo", "build", "--release", "-p", "nvraid"], cwd=ROOT)
        target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
        NVRAID = os.path.join(target, "release", "nvraid")
    size = args.mib << 20
    m = Members(5, size)
    old, new = m.paths[:4], m.paths[4]
    rows = []
    try:
        with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
            data = f"{tmp}/data"
            for rep in range(args.reps + 1):
                rates = {}
                for label, binary in ([("old", args.compare)] if args.compare else []) + [("new", NVRAID)]:
                    for p in m.paths:
                        m.reset(p)
                    made = json.loads(sh([binary, "create", "--level", "5", "--bitmap", args.bitmap,
                                          "--json", *old]).stdout)
                    if not os.path.exists(data):
                        with open(data, "wb") as f:
                            f.write(os.urandom(made["size_bytes"]))
                    sh([binary, "write", "--input", data, *old])
                    # Block devices are not known to be zeros: the new array owes
                    # its first resync, and a grow wants a clean array.
                    sh([binary, "repair", *old])
                    grown = json.loads(sh([binary, "grow", "-n", "5", "--add", new, "--step",
                                           args.step, "--json", *old]).stdout)
                    rates[label] = grown["moved_bytes"] / grown["seconds"]
                grow_rate = rates["new"]
                member_bytes = grown["size_bytes"] // 4
                m.reset(new)
                fio_rate = fio_write(new, 0, member_bytes, f"{tmp}/fio.json")
                if rep == 0:
                    continue  # warm-up: the first writes to a fresh zram device allocate its pool
                rows.append({"grow_bytes_per_s": grow_rate, "fio_bytes_per_s": fio_rate,
                             "moved_bytes": grown["moved_bytes"], "seconds": grown["seconds"],
                             "ratio": grow_rate / fio_rate})
                if args.compare:
                    rows[-1]["old_grow_bytes_per_s"] = rates["old"]
                    rows[-1]["old_ratio"] = rates["old"] / fio_rate
                    rows[-1]["new_over_old"] = grow_rate / rates["old"]
            ratio = statistics.median(r["ratio"] for r in rows)
            kind = "zram" if m.zram else "tmpfs"
            print(f"members: 5 x {args.mib} MiB {kind}; bitmap {args.bitmap}; step {args.step}; "
                  f"{args.reps} repetitions")
            print(f"idle RAID 5 grow 4 -> 5, array bytes moved per second / fio sequential write of "
                  f"one member: {ratio:.3f} (target >= 0.5) runs {[round(r['ratio'], 3) for r in rows]}")
            print("rates MB/s (grow, fio): "
                  f"{[(round(r['grow_bytes_per_s'] / 1e6), round(r['fio_bytes_per_s'] / 1e6)) for r in rows]}")
            if args.compare:
                old_ratio = statistics.median(r["old_ratio"] for r in rows)
                gain = statistics.median(r["new_over_old"] for r in rows)
                print(f"old binary ({args.compare}): {old_ratio:.3f} runs "
                      f"{[round(r['old_ratio'], 3) for r in rows]}; new/old grow rate {gain:.3f} "
                      f"runs {[round(r['new_over_old'], 3) for r in rows]}")
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"members": kind, "mib": args.mib, "bitmap": args.bitmap,
                               "step": args.step, "runs": rows, "ratio": ratio,
                               "compare": args.compare}, f, indent=2)
    finally:
        m.close()


if __name__ == "__main__":
    main()
