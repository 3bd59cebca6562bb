#!/usr/bin/env python3
"""Rebuild speed of an idle RAID 5 (offline with `nvraid add`, and online
inside `nvraid serve`) next to fio's sequential write of the new member
alone, alternating, in one run (issue 33's target: >= 0.8 both ways).

A RAID 5 of four members holding random data (64 KiB chunks, the default
bitmap) loses member 3 for each measurement. Each repetition:
1. offline: a blank member is added with `nvraid add --new` and rebuilt
   (the rate from nvraid's --json report);
2. fio writes the blank new member sequentially (1 MiB, psync, direct) for
   as many bytes;
3. online: `nvraid serve` runs the array, member 3 is failed, removed and a
   blank one added through the control socket; the rate is the server's
   own (`status --json`), read once the rebuild has finished.
The first repetition is a warm-up and not counted.

Members are zram devices (root and zram needed). A zram device is memory:
reading it and writing it costs this machine's CPU, so on a small machine
a rebuild (three members read, one written) competes with itself for the
cores where fio (one member written) does not. `--throttle MBPS` caps every
member's reads and writes at MBPS MB/s with the block layer's throttle
(cgroup blkio or io.max), so that each member behaves like a drive with its
own bandwidth and the CPU is no longer what limits either side; the
ratio then says whether nvraid keeps the drives busy.

With `--compare OLD`, every repetition also rebuilds (offline and online)
with the binary OLD, just before the binary measured: each binary's ratios
are reported, and new/old.

`--favour` runs the whole comparison in a cgroup with the largest CPU
weight, so that other work on a shared machine (builds, tests) yields the
cores to both sides while it runs (with cgroup v2, not with --throttle).

Usage: bench/rebuild-parity-vs-fio.py [--reps 3] [--mib 1024] [--throttle MBPS]
                                      [--compare OLD] [--favour] [--json out.json]
NVRAID=path picks the binary (default target/release/nvraid, built first).
"""
import argparse, json, os, shutil, signal, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVRAID = os.environ.get("NVRAID")


def sh(cmd, **kw):
    done = subprocess.run(cmd, text=True, capture_output=True, **kw)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
    return done


def zram(size):
    with open("/sys/class/zram-control/hot_add") as f:
        n = f.read().strip()
    with open(f"/sys/block/zram{n}/disksize", "w") as f:
        f.write(str(size))
    return f"/dev/zram{n}"


def blank(path, size):
    """Empty a member (as a fresh drive)."""
    n = path.removeprefix("/dev/zram")
    with open(f"/sys/block/zram{n}/reset", "w") as f:
        f.write("1")
    with open(f"/sys/block/zram{n}/disksize", "w") as f:
        f.write(str(size))


def major_minor(path):
    with open(f"/sys/block/{os.path.basename(path)}/dev") as f:
        return f.read().strip()


class Throttle:
    """This process and its children in a cgroup whose members' reads and
    writes are capped at `mbps` MB/s each (cgroup v1 blkio, else v2 io.max)."""

    def __init__(self, mbps):
        self.bps = mbps * 1_000_000
        v1 = "/sys/fs/cgroup/blkio"
        v2 = "/sys/fs/cgroup/unified" if os.path.isdir("/sys/fs/cgroup/unified") else "/sys/fs/cgroup"
        if os.path.exists(f"{v1}/blkio.throttle.write_bps_device"):
            self.dir, self.v1 = f"{v1}/nvraid-bench-{os.getpid()}", True
        elif os.path.exists(f"{v2}/cgroup.controllers"):
            self.dir, self.v1 = f"{v2}/nvraid-bench-{os.getpid()}", False
            with open(f"{v2}/cgroup.subtree_control", "w") as f:
                f.write("+io")
        else:
            sys.exit("--throttle needs the cgroup blkio (v1) or io (v2) controller")
        os.mkdir(self.dir)
        with open(f"{self.dir}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))

    def cap(self, path):
        mm = major_minor(path)
        if self.v1:
            for what in ("read_bps_device", "write_bps_device"):
                with open(f"{self.dir}/blkio.throttle.{what}", "w") as f:
                    f.write(f"{mm} {self.bps}")
        else:
            with open(f"{self.dir}/io.max", "w") as f:
                f.write(f"{mm} rbps={self.bps} wbps={self.bps}")

    def close(self):
        parent = os.path.dirname(self.dir)
        with open(f"{parent}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
        os.rmdir(self.dir)


class Favour:
    """This process and its children in a cgroup with the largest CPU
    weight (cgroup v1 cpu.shares, else v2 cpu.weight): on a machine shared
    with other work (builds, other tests), the scheduler gives both sides
    of the comparison the cores they ask for, and the others wait."""

    def __init__(self):
        v1 = "/sys/fs/cgroup/cpu"
        v2 = "/sys/fs/cgroup/unified" if os.path.isdir("/sys/fs/cgroup/unified") else "/sys/fs/cgroup"
        if os.path.exists(f"{v1}/cpu.shares"):
            self.dir, knob, value = f"{v1}/nvraid-bench-{os.getpid()}", "cpu.shares", "262144"
        elif os.path.exists(f"{v2}/cgroup.controllers"):
            self.dir, knob, value = f"{v2}/nvraid-bench-cpu-{os.getpid()}", "cpu.weight", "10000"
            with open(f"{v2}/cgroup.subtree_control", "w") as f:
                f.write("+cpu")
        else:
            sys.exit("--favour needs the cgroup cpu controller (v1 or v2)")
        os.mkdir(self.dir)
        with open(f"{self.dir}/{knob}", "w") as f:
            f.write(value)
        with open(f"{self.dir}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))

    def close(self):
        parent = os.path.dirname(self.dir)
        with open(f"{parent}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
        os.rmdir(self.dir)


def offline(nvraid, devs, size):
    blank(devs[3], size)
    r = json.loads(sh([nvraid, "add", "--force", "--json", "--new", devs[3], *devs[:3]]).stdout)
    return r["rebuilt"][0]


def fio_write(tmp, dev, nbytes):
    out = f"{tmp}/fio.json"
    sh(["fio", "--name=seq", f"--filename={dev}", "--rw=write", "--bs=1M", "--direct=1",
        "--ioengine=psync", "--offset=1M", f"--size={nbytes}", "--refill_buffers",
        "--buffer_compress_percentage=0", "--output-format=json", f"--output={out}"])
    with open(out) as f:
        return json.load(f)["jobs"][0]["write"]["bw_bytes"]


def online(nvraid, tmp, devs, size):
    """The server's rebuild of member 3, failed, removed and replaced by a
    blank one through the control socket; the rebuild's report."""
    sock, ctl = f"{tmp}/md.sock", f"{tmp}/md.ctl"
    with open(f"{tmp}/serve.log", "w") as log:
        server = subprocess.Popen([nvraid, "serve", "--listen", f"unix:{sock}", *devs], stderr=log)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(ctl):
            if time.monotonic() > deadline or server.poll() is not None:
                sys.exit(f"serve did not start: {open(f'{tmp}/serve.log').read()}")
            time.sleep(0.05)
        sh([nvraid, "fail", "--socket", ctl, "--member", devs[3]])
        sh([nvraid, "remove", "--socket", ctl, "--member", devs[3]])
        blank(devs[3], size)
        sh([nvraid, "add", "--socket", ctl, "--new", devs[3]])
        while True:
            time.sleep(0.5)
            r = json.loads(sh([nvraid, "status", "--json", "--socket", ctl]).stdout)
            rebuild = r["array"]["recovery"]["rebuild"]
            if rebuild and rebuild.get("error"):
                sys.exit(f"online rebuild failed: {rebuild}")
            if rebuild and rebuild["finished"]:
                return rebuild
    finally:
        server.send_signal(signal.SIGINT)
        server.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mib", type=int, default=1024, help="member size in MiB")
    ap.add_argument("--throttle", type=int, help="cap each member's reads and writes at MBPS MB/s")
    ap.add_argument("--compare", metavar="OLD", help="also rebuild with this binary, alternating")
    ap.add_argument("--favour", action="store_true",
                    help="run in a cgroup with the largest CPU weight (a machine shared with other work)")
    ap.add_argument("--json")
    args = ap.parse_args()
    global NVRAID
    if os.geteuid() != 0 or not os.path.exists("/sys/class/zram-control/hot_add"):
        sys.exit("zram members need root and the zram module (modprobe zram)")
    if shutil.which("fio") is None:
        subprocess.run(["apt-get", "install", "-y", "-qq", "fio"], check=True)
    if NVRAID is None:
        sh(["cargo", "build", "--release", "-p", "nvraid"], cwd=ROOT)
        target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
        NVRAID = os.path.join(target, "release", "nvraid")
    binaries = ([("old", args.compare)] if args.compare else []) + [("new", NVRAID)]
    size = args.mib << 20
    devs = [zram(size) for _ in range(4)]
    throttle = None
    favour = Favour() if args.favour else None
    rows = []
    try:
        for dev in devs:
            sh(["fio", "--name=fill", f"--filename={dev}", "--rw=write", "--bs=1M", "--direct=1",
                "--ioengine=psync", "--refill_buffers", "--buffer_compress_percentage=0",
                f"--size={size}", "--output-format=terse"])
        sh([NVRAID, "create", "--level", "5", "--chunk", "64K", "--force", *devs])
        sh([NVRAID, "repair", *devs])
        if args.throttle:
            throttle = Throttle(args.throttle)
            for dev in devs:
                throttle.cap(dev)
        with tempfile.TemporaryDirectory() as tmp:
            for rep in range(args.reps + 1):
                row = {}
                for label, binary in binaries:
                    off = offline(binary, devs, size)
                    if label == "new":
                        blank(devs[3], size)
                        if throttle:
                            throttle.cap(devs[3])
                        fio_rate = fio_write(tmp, devs[3], off["bytes"])
                        # Back in the array (rebuilt) before the server fails it.
                        offline(binary, devs, size)
                    if throttle:
                        throttle.cap(devs[3])
                    on = online(binary, tmp, devs, size)
                    if throttle:
                        throttle.cap(devs[3])
                    prefix = "" if label == "new" else "old_"
                    row[f"{prefix}offline_bytes_per_s"] = off["rate_bytes_per_second"]
                    row[f"{prefix}online_bytes_per_s"] = on["rate_bytes_per_second"]
                row["fio_bytes_per_s"] = fio_rate
                for prefix in [label for label in ("", "old_") if f"{label}offline_bytes_per_s" in row]:
                    row[f"{prefix}offline_ratio"] = row[f"{prefix}offline_bytes_per_s"] / fio_rate
                    row[f"{prefix}online_ratio"] = row[f"{prefix}online_bytes_per_s"] / fio_rate
                if rep == 0:
                    continue  # warm-up: the first writes to a fresh zram device allocate its pool
                rows.append(row)
                print(f"rep {rep}: MB/s offline {row['offline_bytes_per_s'] / 1e6:.0f}, "
                      f"online {row['online_bytes_per_s'] / 1e6:.0f}, fio {fio_rate / 1e6:.0f}", flush=True)
                if args.compare:
                    print(f"rep {rep}: old binary MB/s offline {row['old_offline_bytes_per_s'] / 1e6:.0f}, "
                          f"online {row['old_online_bytes_per_s'] / 1e6:.0f}", flush=True)
        kind = f"zram capped at {args.throttle} MB/s" if args.throttle else "zram"
        off_ratio = statistics.median(r["offline_ratio"] for r in rows)
        on_ratio = statistics.median(r["online_ratio"] for r in rows)
        print(f"members: 4 x {args.mib} MiB {kind}; {args.reps} repetitions")
        print(f"offline rebuild of a RAID 5 member / fio sequential write: {off_ratio:.3f} "
              f"(target >= 0.8) runs {[round(r['offline_ratio'], 3) for r in rows]}")
        print(f"online rebuild (serve, idle) / fio sequential write: {on_ratio:.3f} "
              f"(target >= 0.8) runs {[round(r['online_ratio'], 3) for r in rows]}")
        if args.compare:
            for way in ("offline", "online"):
                old = statistics.median(r[f"old_{way}_ratio"] for r in rows)
                gain = statistics.median(r[f"{way}_bytes_per_s"] / r[f"old_{way}_bytes_per_s"] for r in rows)
                print(f"old binary ({args.compare}) {way}: {old:.3f} runs "
                      f"{[round(r[f'old_{way}_ratio'], 3) for r in rows]}; new/old {gain:.3f} runs "
                      f"{[round(r[f'{way}_bytes_per_s'] / r[f'old_{way}_bytes_per_s'], 3) for r in rows]}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"members": kind, "mib": args.mib, "runs": rows, "compare": args.compare,
                           "offline_ratio": off_ratio, "online_ratio": on_ratio}, f, indent=2)
    finally:
        if throttle:
            throttle.close()
        if favour:
            favour.close()
        for dev in devs:
            try:
                with open("/sys/class/zram-control/hot_remove", "w") as f:
                    f.write(dev.removeprefix("/dev/zram"))
            except OSError:
                pass


if __name__ == "__main__":
    main()
