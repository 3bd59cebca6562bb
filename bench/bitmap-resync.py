#!/usr/bin/env python3
"""A resync after a crash, with and without md's write-intent bitmap.

Two RAID 1 arrays of two 4 GiB members, filled with data (the same on both
copies; holes would make the full resync read the zero page instead of
data): one with a bitmap of 1 MiB chunks (4096 bits), one without. Members
are zram devices (O_DIRECT block devices) when run as root with zram, else
files on /dev/shm. On each, `nvraid bench` writes 4K
blocks at random into the first 40 MiB (1% of the array) and is killed
(SIGKILL) after 3 s: the array is left dirty. `nvraid repair --json` then
resyncs it: the bitmap array only where bits are set (about 1% of its
chunks), the other everywhere. Prints both times and their ratio (target:
the 1% resync takes at most 2% of the full one's time), 3 repetitions.

    bench/bitmap-resync.py [NVRAID]     (default: target/release/nvraid)
"""
import json, subprocess, statistics, sys, os, time, signal
NV = sys.argv[1] if len(sys.argv) > 1 else "target/release/nvraid"
SIZE = "4G"

ZRAM = os.geteuid() == 0 and os.path.exists("/sys/class/zram-control/hot_add")
ZRAMS = []

def members(tag):
    if not ZRAM:
        return [f"/dev/shm/bmresync-{tag}{i}.img" for i in range(2)]
    while len(ZRAMS) < 2:
        with open("/sys/class/zram-control/hot_add") as f:
            ZRAMS.append(f"/dev/zram{f.read().strip()}")
    for dev in ZRAMS:
        n = dev.removeprefix("/dev/zram")
        with open(f"/sys/block/zram{n}/reset", "w") as f:
            f.write("1")
        with open(f"/sys/block/zram{n}/disksize", "w") as f:
            f.write(SIZE)
    return list(ZRAMS)

def crashed(tag, bitmap):
    ms = members(tag)
    block = os.urandom(1 << 20)
    for m in ms:
        with open(m, "wb") as f:
            for _ in range(4096):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
    subprocess.run([NV, "create", "--level", "1", "--force", *bitmap, *ms], check=True, capture_output=True)
    bench = subprocess.Popen([NV, "bench", "--rw", "randwrite", "--bs", "4k", "--iodepth", "16",
                              "--size", "40M", "--runtime", "60s", "--destructive", *ms],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(3)
    bench.send_signal(signal.SIGKILL)
    bench.wait()
    detail = json.loads(subprocess.run([NV, "detail", "--json", *ms], check=True,
                                       capture_output=True, text=True).stdout)
    assert detail["state"].startswith("active"), detail["state"]
    return ms, detail.get("bitmap")

def resync(ms):
    p = subprocess.run([NV, "repair", "--json", *ms], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"repair failed: {p.stderr}")
    r = json.loads(p.stdout)
    assert r["resynced"], r
    return r["seconds"], r["bytes"]

ratios = []
for rep in range(3):
    full_ms, _ = crashed("none", ["--bitmap", "none"])
    full_s, full_b = resync(full_ms)
    bm_ms, info = crashed("bitmap", ["--bitmap", "internal", "--bitmap-chunk", "1M"])
    bm_s, bm_b = resync(bm_ms)
    ratios.append(bm_s / full_s)
    print(f"rep {rep}: dirty chunks {info['dirty_chunks']}/{info['chunks']}; bitmap resync "
          f"{bm_b >> 20} MiB in {bm_s:.3f} s, full resync {full_b >> 20} MiB in {full_s:.3f} s, "
          f"ratio {bm_s / full_s:.4f}", flush=True)
    if not ZRAM:
        for m in full_ms + bm_ms:
            os.remove(m)
for dev in ZRAMS:
    with open("/sys/class/zram-control/hot_remove", "w") as f:
        f.write(dev.removeprefix("/dev/zram"))
print(f"members: {'zram' if ZRAM else 'tmpfs'}")
print(f"bitmap/full resync time: median {statistics.median(ratios):.4f} runs {[round(r, 4) for r in ratios]}")
