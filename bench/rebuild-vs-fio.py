#!/usr/bin/env python3
"""Rebuild speed of an idle RAID 1 next to fio's sequential write bandwidth
of the new member alone, alternating, in one run.

After one warm-up round that is not counted, for each repetition: a RAID 1 of two members holding random data loses
member 1; a fresh member is added with `nvraid add` and rebuilt (timed by
nvraid's own --json report); then fio writes the same new member
sequentially (1 MiB, psync, direct) for the same number of bytes. The ratio
is rebuild rate / fio rate (target >= 0.9, issue 10).

Members are zram devices when run as root with zram available (O_DIRECT
block devices), else files on /dev/shm.

Usage: bench/rebuild-vs-fio.py [--reps 3] [--mib 1024] [--json out.json]
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVRAID = os.environ.get("NVRAID", os.path.join(ROOT, "target", "release", "nvraid"))


def sh(cmd, **kw):
    done = subprocess.run(cmd, text=True, capture_output=True, **kw)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
    return done


class Members:
    def __init__(self, count, size):
        self.zram = os.geteuid() == 0 and os.path.exists("/sys/class/zram-control/hot_add")
        self.paths = []
        for i in range(count):
            if self.zram:
                with open("/sys/class/zram-control/hot_add") as f:
                    n = f.read().strip()
                with open(f"/sys/block/zram{n}/disksize", "w") as f:
                    f.write(str(size))
                self.paths.append(f"/dev/zram{n}")
            else:
                path = f"/dev/shm/nvraid-rebuild-{os.getpid()}-{i}"
                with open(path, "wb") as f:
                    f.truncate(size)
                self.paths.append(path)

    def reset(self, path, size):
        """Empty a member (as a fresh drive)."""
        if self.zram:
            n = path.removeprefix("/dev/zram")
            with open(f"/sys/block/zram{n}/reset", "w") as f:
                f.write("1")
            with open(f"/sys/block/zram{n}/disksize", "w") as f:
                f.write(str(size))
        else:
            with open(path, "wb") as f:
                f.truncate(size)

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mib", type=int, default=1024, help="member size in MiB")
    ap.add_argument("--json")
    args = ap.parse_args()
    if shutil.which("fio") is None:
        subprocess.run(["apt-get", "install", "-y", "-qq", "fio"], check=True)
    sh(["cargo", "build", "--release", "-p", "nvraid"], cwd=ROOT)
    size = args.mib << 20
    m = Members(3, size)
    a, b, new = m.paths
    rows = []
    try:
        sh([NVRAID, "create", "--level", "1", "--force", a, b])
        with tempfile.TemporaryDirectory() as tmp:
            data = f"{tmp}/data"
            sh(["fio", "--name=fill", f"--filename={a}", "--rw=write", "--bs=1M", "--direct=1",
                "--ioengine=psync", "--offset=1M", f"--size={size - (2 << 20)}",
                "--refill_buffers", "--buffer_compress_percentage=0", f"--output={tmp}/f.txt"])
            for rep in range(args.reps + 1):
                m.reset(new, size)
                report = json.loads(sh([NVRAID, "add", "--force", "--json", "--new", new, a]).stdout)
                r = report["rebuilt"][0]
                rebuild_rate = r["rate_bytes_per_second"]
                m.reset(new, size)
                out = f"{tmp}/fio.json"
                sh(["fio", "--name=seq", f"--filename={new}", "--rw=write", "--bs=1M", "--direct=1",
                    "--ioengine=psync", f"--size={r['bytes']}", "--refill_buffers",
                    "--buffer_compress_percentage=0", "--output-format=json", f"--output={out}"])
                with open(out) as f:
                    fio_rate = json.load(f)["jobs"][0]["write"]["bw_bytes"]
                if rep == 0:
                    continue  # warm-up: the first writes to a fresh zram device allocate its pool
                rows.append({"rebuild_bytes_per_s": rebuild_rate, "fio_bytes_per_s": fio_rate,
                             "ratio": rebuild_rate / fio_rate})
            ratio = statistics.median(r["ratio"] for r in rows)
            kind = "zram" if m.zram else "tmpfs"
            print(f"members: 3 x {args.mib} MiB {kind}; {args.reps} repetitions")
            print(f"rebuild of an idle RAID 1 / fio sequential write of the new member: {ratio:.3f} "
                  f"(target >= 0.9) runs {[round(r['ratio'], 3) for r in rows]}")
            print("rates MB/s (rebuild, fio): "
                  f"{[(round(r['rebuild_bytes_per_s'] / 1e6), round(r['fio_bytes_per_s'] / 1e6)) for r in rows]}")
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"members": kind, "mib": args.mib, "runs": rows, "ratio": ratio}, f, indent=2)
    finally:
        m.close()


if __name__ == "__main__":
    main()
