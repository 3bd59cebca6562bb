#!/usr/bin/env python3
"""Client 4K random reads through NBD during an online RAID 5 grow (4 -> 5
members, `nvraid grow --socket`) against the same reads with no grow, side
by side in one run (issue 33's target: >= 0.5).

For each repetition (after one warm-up round that is not counted): a RAID 5
of four members (files on /dev/shm) is created and filled (`nvraid write`
of random bytes), served (`nvraid serve`, default pacing: 50 MB/s while
clients are busy, unlimited while idle, as the rebuild's), and fio reads
4 KiB at random through NBD (libaio-less: fio's nbd engine, iodepth 16,
2 jobs) for SECONDS, first with no grow (baseline), then again right
after `grow --socket -n 5 --add` started (the grow must still be running
when fio ends, or the round is reported as such), and once more after
the grow ended (the served array has then taken the grown shape,
`Array::swap_shape`, and serves it through the fast path again). The ratio is the grow
round's IOPS / the baseline's. The grow's rate while fio ran (positions
from `status` 1 s in and 1 s before its end) is printed beside it.

With --idle, each repetition also grows the same array with no client at
all, once served (`grow --socket`, default pacing) and once offline
(`nvraid grow`), and prints each one's array bytes moved per second (the
new shape's size / the wall time from the command to the end).

Usage: bench/online-grow-read.py [--reps 3] [--mib 1024] [--seconds 5] [--idle]
NVRAID=path picks the binary (default target/release/nvraid).
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(cmd, **kw):
    done = subprocess.run(cmd, text=True, capture_output=True, **kw)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
    return done


def fio_iops(sock, seconds, size):
    out = sh(["fio", "--name=r", "--ioengine=nbd", f"--uri=nbd+unix:///?socket={sock}",
              "--rw=randread", "--bs=4k", "--iodepth=16", "--numjobs=2", "--group_reporting",
              f"--runtime={seconds}", "--time_based", f"--size={size}",
              "--output-format=json"]).stdout
    return json.loads(out[out.index("{"):])["jobs"][0]["read"]["iops"]


def status(nvraid, ctl):
    out = sh([nvraid, "status", "--json", "--socket", ctl]).stdout
    return json.loads(out)["array"].get("reshape")


def make_array(nvraid, work, mib):
    members = [os.path.join(work, f"m{i}") for i in range(5)]
    for m in members:
        if os.path.exists(m):
            os.unlink(m)
    sh([nvraid, "create", "--level", "5", "--size", f"{mib}M", "--force"] + members[:4])
    size = int(json.loads(sh([nvraid, "detail", "--json"] + members[:4]).stdout)["size_bytes"])
    with open(os.path.join(work, "data"), "wb") as f:
        f.write(os.urandom(size))
    sh([nvraid, "write", "--input", os.path.join(work, "data")] + members[:4])
    os.unlink(os.path.join(work, "data"))
    with open(members[4], "wb") as f:
        f.truncate(mib << 20)
    return members, size


def idle_rates(nvraid, work, mib):
    """Array bytes per second of an idle grow 4 -> 5, served and offline."""
    members, _ = make_array(nvraid, work, mib)
    sock, ctl = os.path.join(work, "md.sock"), os.path.join(work, "md.ctl")
    log = open(os.path.join(work, "serve.log"), "w")
    server = subprocess.Popen([nvraid, "serve", "--listen", f"unix:{sock}"] + members[:4],
                              stderr=log)
    for _ in range(400):
        if os.path.exists(ctl):
            break
        time.sleep(0.025)
    try:
        t = time.monotonic()
        sh([nvraid, "grow", "--socket", ctl, "-n", "5", "--add", members[4]])
        online_s = time.monotonic() - t
        s = status(nvraid, ctl)
        assert s["state"] == "finished", s
        end = s["end_bytes"]
    finally:
        server.send_signal(2)
        server.wait()
    members, _ = make_array(nvraid, work, mib)
    t = time.monotonic()
    sh([nvraid, "grow", "-n", "5", "--add", members[4]] + members[:4])
    offline_s = time.monotonic() - t
    return end / online_s, end / offline_s


def one_round(nvraid, work, mib, seconds):
    members, size = make_array(nvraid, work, mib)
    sock, ctl = os.path.join(work, "md.sock"), os.path.join(work, "md.ctl")
    log = open(os.path.join(work, "serve.log"), "w")
    server = subprocess.Popen([nvraid, "serve", "--listen", f"unix:{sock}"] + members[:4],
                              stderr=log)
    for _ in range(400):
        if os.path.exists(ctl):
            break
        time.sleep(0.025)
    try:
        base = fio_iops(sock, seconds, size)
        grow = subprocess.Popen([nvraid, "grow", "--socket", ctl, "-n", "5", "--add", members[4]],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.2)
        # The grow's rate while fio runs: positions sampled a second in
        # and a second before its end (fio's start-up and end, when the
        # grow is idle and unlimited, left out).
        marks = []

        def sample():
            t0 = time.monotonic()
            for at in (1.0, seconds - 1.0):
                time.sleep(max(0.0, t0 + at - time.monotonic()))
                g = status(nvraid, ctl)
                marks.append((time.monotonic(), g["position_bytes"] if g else 0))

        sampler = threading.Thread(target=sample)
        sampler.start()
        during = fio_iops(sock, seconds, size)
        sampler.join()
        busy_rate = (marks[1][1] - marks[0][1]) / (marks[1][0] - marks[0][0])
        s = status(nvraid, ctl)
        still = s is not None and s["state"] == "running"
        grow.wait()
        # The grow done, its route still takes the requests until restart.
        after = fio_iops(sock, seconds, size)
        return base, during, after, still, s, busy_rate
    finally:
        server.send_signal(2)
        server.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--idle", action="store_true")
    args = ap.parse_args()
    nvraid = os.environ.get("NVRAID") or os.path.join(ROOT, "target/release/nvraid")
    work = tempfile.mkdtemp(dir="/dev/shm", prefix="nvraid-online-grow-")
    rows, afters, online, offline = [], [], [], []
    try:
        for rep in range(args.reps + 1):
            base, during, after, still, s, busy_rate = one_round(nvraid, work, args.mib, args.seconds)
            tag = "warm-up" if rep == 0 else f"rep {rep}"
            print(f"{tag}: no grow {base:.0f} IOPS, during the grow {during:.0f} IOPS, "
                  f"ratio {during / base:.2f}{'' if still else ' (the grow ended before fio did)'}; "
                  f"grow at {s['position_bytes'] if s else '?'} of {s['end_bytes'] if s else '?'} bytes, "
                  f"{busy_rate / 1e6:.0f} MB/s while fio ran; "
                  f"after it (the grown shape, swapped in) {after:.0f} IOPS, ratio {after / base:.2f}")
            if rep > 0:
                rows.append(during / base)
                afters.append(after / base)
            if args.idle and rep > 0:
                on, off = idle_rates(nvraid, work, args.mib)
                online.append(on)
                offline.append(off)
                print(f"{tag}: idle grow {on / 1e6:.0f} MB/s served, {off / 1e6:.0f} MB/s offline "
                      f"(array bytes of the new shape per second), ratio {on / off:.2f}")
    finally:
        for f in os.listdir(work):
            os.unlink(os.path.join(work, f))
        os.rmdir(work)
    print(f"median ratio {statistics.median(rows):.2f} over {len(rows)} reps (target >= 0.5): "
          + " ".join(f"{r:.2f}" for r in rows))
    print(f"after the grow, median {statistics.median(afters):.2f}: "
          + " ".join(f"{r:.2f}" for r in afters))
    if online:
        print(f"idle grow, median {statistics.median(online) / 1e6:.0f} MB/s served, "
              f"{statistics.median(offline) / 1e6:.0f} MB/s offline")


if __name__ == "__main__":
    main()
