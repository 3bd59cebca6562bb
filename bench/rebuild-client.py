#!/usr/bin/env python3
"""Client 4K random reads through `nvraid serve` during an online rebuild,
next to the same reads without one (issue 10: >= 0.5x at default limits).

A RAID 1 of two 2 GiB members holding data is served over NBD (unix
socket). Each repetition: fio reads 4K blocks at random, QD 32, 2 jobs, for
5 s (the baseline); then member 1 is failed and removed and a blank member
added through the control socket, and the same fio runs while the server
rebuilds it at its default limits (50 MB/s while clients are busy,
unlimited when idle); the rebuild must still be running when fio ends.
Then the rebuild finishes (unpaced) before the next repetition.

Members are zram devices when run as root with zram, else /dev/shm files.

    bench/rebuild-client.py [--reps 3] [NVRAID]
"""
import json, os, subprocess, statistics, sys, tempfile, time, shutil

args = [a for a in sys.argv[1:] if not a.startswith("--reps")]
REPS = 3
for a in sys.argv[1:]:
    if a.startswith("--reps="):
        REPS = int(a.split("=")[1])
NV = args[0] if args else "target/release/nvraid"
SIZE = 2 << 30
ZRAM = os.geteuid() == 0 and os.path.exists("/sys/class/zram-control/hot_add")
made = []

def member(i):
    if ZRAM:
        with open("/sys/class/zram-control/hot_add") as f:
            dev = f"/dev/zram{f.read().strip()}"
        with open(f"/sys/block/{dev[5:]}/disksize", "w") as f:
            f.write(str(SIZE))
        made.append(dev)
        return dev
    path = f"/dev/shm/rebuild-client-{i}.img"
    with open(path, "wb") as f:
        f.truncate(SIZE)
    made.append(path)
    return path

def blank(dev):
    if ZRAM:
        with open(f"/sys/block/{dev[5:]}/reset", "w") as f:
            f.write("1")
        with open(f"/sys/block/{dev[5:]}/disksize", "w") as f:
            f.write(str(SIZE))
    else:
        with open(dev, "wb") as f:
            f.truncate(SIZE)

def nv(*a, **kw):
    p = subprocess.run([NV, *a], capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"nvraid {' '.join(a)}: {p.stderr}")
    return p.stdout

work = tempfile.mkdtemp()
sock, ctl = f"{work}/md.sock", f"{work}/md.ctl"
m = [member(i) for i in range(3)]
block = os.urandom(1 << 20)
for dev in m[:2]:
    with open(dev, "wb") as f:
        for _ in range(SIZE >> 20):
            f.write(block)
nv("create", "--level", "1", "--force", m[0], m[1])
log = open(f"{work}/serve.log", "w")
server = subprocess.Popen([NV, "serve", "--listen", f"unix:{sock}", m[0], m[1]], stderr=log)
while not os.path.exists(ctl):
    time.sleep(0.05)

def fio():
    p = subprocess.run(["fio", "--name=r", "--ioengine=nbd", f"--uri=nbd+unix:///?socket={sock}",
                        "--rw=randread", "--bs=4k", "--iodepth=32", "--numjobs=2", "--time_based",
                        "--runtime=5", "--group_reporting", "--output-format=json"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(p.stderr)
    return json.loads(p.stdout[p.stdout.find("{"):])["jobs"][0]["read"]["iops"]

def rebuild():
    return json.loads(nv("status", "--json", "--socket", ctl))["array"]["recovery"]["rebuild"]

fio()  # warm-up
ratios = []
active, spare = m[1], m[2]
for rep in range(REPS):
    base = fio()
    nv("fail", "--socket", ctl, "--member", active)
    nv("remove", "--socket", ctl, "--member", active)
    blank(spare)
    nv("add", "--socket", ctl, "--new", spare)
    time.sleep(0.3)
    during = fio()
    r = rebuild()
    assert not r["finished"], f"the rebuild ended before fio did: {r}"
    ratios.append(during / base)
    print(f"rep {rep}: without {base:.0f} IOPS, during rebuild {during:.0f} IOPS, ratio {during / base:.3f}; "
          f"rebuild at {r['done_bytes'] >> 20} MiB of {r['total_bytes'] >> 20}, {r['rate_bytes_per_second'] / 1e6:.0f} MB/s",
          flush=True)
    while not rebuild()["finished"]:
        time.sleep(0.2)
    active, spare = spare, active
print(f"members: {'zram' if ZRAM else 'tmpfs'}")
print(f"during/without: median {statistics.median(ratios):.3f} runs {[round(x, 3) for x in ratios]}")
server.send_signal(2)
server.wait()
for dev in made:
    if ZRAM:
        with open("/sys/class/zram-control/hot_remove", "w") as f:
            f.write(dev[len("/dev/zram"):])
    else:
        os.remove(dev)
shutil.rmtree(work)
