#!/usr/bin/env python3
"""The array as /dev/ublkb0, side by side with kernel NBD, kernel md and nvraid's own bench.

In one boot of tools/mdvm's Linux 6.12 VM (TCG here: see docs/PERFORMANCE.md),
over the same 4 virtio disks (raw files on the host, --dir, default /dev/shm),
for a RAID 5 and then a RAID 0 of the 4, both with 64 KiB chunks, fio in the
guest (a static fio from tools/mdvm/build-fio, io_uring engine, direct=1)
measures:

  ublk   nvraid serve --ublk 0 ...          fio on /dev/ublkb0
  nbd    the same server, --listen unix:/tmp/nvraid.sock, and the kernel's
         NBD client (nbd-client -unix, one connection per guest CPU)
                                            fio on /dev/nbd0
  bench  nvraid bench on the array's members (in-process, no device)
  md     mdadm --create over the same disks, same level and chunk
                                            fio on /dev/md0

ublk and nbd are one server process with both front ends, fio alternating
between the two devices workload by workload (and repetition by repetition
with --reps; ublk / nbd is then the median of the repetitions' ratios, the
other columns the medians of their own runs; bench and md run once). The RAID 5 is created on the host on new (zero) files, so it is
in sync without a resync, and gets nvraid's default internal bitmap; md's
RAID 5 is created with --assume-clean and --bitmap=internal, so both carry
the same write-intent cost. The RAID 0 is created in the guest afterwards.

Workloads: 4K random read and 4K random write at QD 32 with 2 jobs (2 vCPUs),
1 MiB sequential read and write at QD 8 with 1 job. Prints a table of IOPS
and MB/s, and the ratios issue 31 sets targets for:
  ublk / nbd   4K random read >= 1.5, 4K random write >= 1.5, 1M seq read >= 1.2
  ublk / md    reported (no target)
  ublk / bench 4K random read: the device path adds <= 15%, i.e. >= 1/1.15

Usage: bench/ublk-vm.py [--runtime 5] [--ramp 1] [--reps 1] [--levels 5,0]
                        [--disk-mib 1024] [--dir /dev/shm] [--smp 2]
                        [--json out.json] [--smoke]
Environment: NVRAID (the binary; default: cargo build --release, then
$CARGO_TARGET_DIR/release/nvraid), NVRAID_MDVM (another mdvm).
Needs (Debian): qemu-system-x86 busybox-static mdadm nbd-client, and
tools/mdvm/build-fio's dpkg-dev gcc make zlib1g-dev; network once for the
6.12 kernel and fio's source.
"""
import argparse, json, os, platform, shutil, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MDVM = os.environ.get("NVRAID_MDVM", os.path.join(ROOT, "tools", "mdvm", "mdvm"))

# name, fio rw, bs, iodepth, numjobs
WORKLOADS = [
    ("4k-randread", "randread", "4k", 32, 2),
    ("4k-randwrite", "randwrite", "4k", 32, 2),
    ("1m-read", "read", "1m", 8, 1),
    ("1m-write", "write", "1m", 8, 1),
]
TARGETS = ["ublk", "nbd", "bench", "md"]
# (workload, ratio, minimum) that issue 31 sets
GOALS = [
    ("4k-randread", "ublk/nbd", 1.5),
    ("4k-randwrite", "ublk/nbd", 1.5),
    ("1m-read", "ublk/nbd", 1.2),
    ("4k-randread", "ublk/bench", 1 / 1.15),
]


def sh(cmd, **kw):
    done = subprocess.run(cmd, text=True, capture_output=True, **kw)
    if done.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def host_tool(name):
    for d in ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]:
        p = os.path.join(d, name)
        if os.path.exists(p):
            return p
    sys.exit(f"{name} not found on the host (apt-get install nbd-client)")


def ship(inside, binary):
    """Copy a binary and the libraries ldd names (but libc: the guest has it) into inside."""
    shutil.copy(binary, inside)
    out = subprocess.run(["ldd", binary], text=True, capture_output=True).stdout
    for line in out.splitlines():
        if "=>" not in line:
            continue
        path = line.split("=>")[1].split()[0]
        lib = os.path.basename(path)
        if path.startswith("/") and not lib.startswith("libc.so") and not os.path.exists(os.path.join(inside, lib)):
            shutil.copy(path, inside)


GUEST = r"""
set -e
export LD_LIBRARY_PATH=$MDVM_IN
N=$MDVM_IN/nvraid
FIO=$MDVM_IN/fio
OUT=$MDVM_OUT
DISKS=$MDVM_DISKS
fail() { echo "FAIL: $*"; for f in /tmp/*.log; do echo "== $f"; tail -20 "$f"; done; exit 1; }
wait_for() { # TEST-ARGS...: up to 60 s
	n=0
	while ! [ "$@" ]; do
		n=$((n + 1)); [ $n -lt 600 ] || fail "timed out waiting for [ $* ]"
		sleep 0.1
	done
}
# fio on a device: fio_on TARGET LEVEL DEVICE WORKLOAD RW BS QD JOBS REP
fio_on() {
	$FIO --name=$4 --filename=$3 --ioengine=io_uring --direct=1 --rw=$5 --bs=$6 \
		--iodepth=$7 --numjobs=$8 --group_reporting --time_based --runtime=$RUNTIME \
		--ramp_time=$RAMP --norandommap --randrepeat=0 --output-format=json \
		--output=$OUT/$1-$2-$4-$9.json > /tmp/fio.log 2>&1 || { cat /tmp/fio.log; fail "fio $1 $2 $4"; }
	echo "RAN $1 raid$2 $4 rep $9"
}
bench_on() { # LEVEL WORKLOAD RW BS QD JOBS
	$N bench --rw $3 --bs $4 --iodepth $5 --numjobs $6 --runtime ${RUNTIME}s --ramp ${RAMP}s \
		--destructive --json $DISKS > $OUT/bench-$1-$2-1.json 2> /tmp/bench.log || fail "nvraid bench raid$1 $2"
	echo "RAN bench raid$1 $2"
}
echo "GUEST kernel=$(uname -r) cpus=$(grep -c ^processor /proc/cpuinfo) mem_kb=$(sed -n 's/MemTotal: *\([0-9]*\).*/\1/p' /proc/meminfo)"
for L in $LEVELS; do
	if [ $L != 5 ]; then
		$N create --level $L --chunk 64K --force $DISKS > /tmp/create.log 2>&1 || fail "nvraid create raid$L"
	fi
	# (a) and (b): one server, the array as /dev/ublkb0 and over NBD.
	$N serve --ublk 0 --listen unix:/tmp/nvraid.sock --control /tmp/ctl $DISKS 2> /tmp/serve-$L.log &
	SRV=$!
	wait_for -b /dev/ublkb0
	wait_for -S /tmp/nvraid.sock
	$MDVM_IN/nbd-client -unix /tmp/nvraid.sock /dev/nbd0 -b 4096 -C $CONNS > /tmp/nbd.log 2>&1 ||
		fail "nbd-client: $(cat /tmp/nbd.log)"
	n=0
	while [ "$(cat /sys/block/nbd0/size)" = 0 ]; do
		n=$((n + 1)); [ $n -lt 600 ] || fail "/dev/nbd0 has no size"
		sleep 0.1
	done
	echo "SERVED raid$L ublkb0=$(cat /sys/block/ublkb0/size) nbd0=$(cat /sys/block/nbd0/size) sectors"
	$N status --socket /tmp/ctl | sed 's/^/STATUS /'
	rep=1
	while [ $rep -le $REPS ]; do
		for w in $WORKLOADS; do
			set -- $(echo $w | tr : ' ')
			fio_on ublk $L /dev/ublkb0 $1 $2 $3 $4 $5 $rep
			fio_on nbd $L /dev/nbd0 $1 $2 $3 $4 $5 $rep
		done
		rep=$((rep + 1))
	done
	$MDVM_IN/nbd-client -d /dev/nbd0 > /dev/null 2>&1 || fail "nbd-client -d"
	kill -TERM $SRV
	wait $SRV || fail "nvraid serve exited $?"
	# (d) nvraid's own bench on the same array, in-process.
	for w in $WORKLOADS; do
		set -- $(echo $w | tr : ' ')
		bench_on $L $1 $2 $3 $4 $5
	done
	# (c) kernel md over the same disks, same level and chunk.
	bitmap=
	[ $L = 0 ] || bitmap=--bitmap=internal
	mdadm --create /dev/md0 --run --metadata=1.2 --level=$L --chunk=64 --raid-devices=4 \
		--assume-clean $bitmap $DISKS > /tmp/mdadm.log 2>&1 || fail "mdadm --create raid$L"
	echo "MD raid$L $(cat /sys/block/md0/size) sectors $(cat /sys/block/md0/md/bitmap/chunksize 2> /dev/null) bitmap chunk"
	for w in $WORKLOADS; do
		set -- $(echo $w | tr : ' ')
		fio_on md $L /dev/md0 $1 $2 $3 $4 $5 1
	done
	mdadm --stop /dev/md0 > /dev/null 2>&1 || fail "mdadm --stop"
	mdadm --zero-superblock $DISKS || fail "mdadm --zero-superblock"
done
echo DONE
"""


def load(path):
    with open(path) as f:
        job = json.load(f)["jobs"][0]
    return (job["read"]["iops"] + job["write"]["iops"], job["read"]["bw_bytes"] + job["write"]["bw_bytes"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runtime", type=int, default=5, help="seconds of each fio/bench run (default 5)")
    ap.add_argument("--ramp", type=int, default=1, help="seconds of ramp before each (default 1)")
    ap.add_argument("--reps", type=int, default=1, help="alternating ublk/nbd repetitions (median)")
    ap.add_argument("--levels", default="5,0", help="comma list of 5 and 0, in order (5 must come first)")
    ap.add_argument("--disk-mib", type=int, default=1024, help="size of each of the 4 disks")
    ap.add_argument("--dir", default="/dev/shm", help="where the disk images live on the host")
    ap.add_argument("--smp", type=int, default=2)
    ap.add_argument("--mem", default="2G")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--smoke", action="store_true", help="~1 min: 256 MiB disks, 1 s runs, no ramp")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args()
    if a.smoke:
        a.runtime, a.ramp, a.disk_mib, a.reps = 1, 0, 256, 1
    levels = a.levels.split(",")
    if any(l not in ("5", "0") for l in levels) or ("5" in levels and levels[0] != "5"):
        sys.exit("--levels: 5 and/or 0, RAID 5 first (it is created on the host on zero files)")

    nvraid = os.environ.get("NVRAID")
    if not nvraid:
        sh(["cargo", "build", "--release", "-p", "nvraid", "--bin", "nvraid"], cwd=ROOT)
        tgt = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
        nvraid = os.path.join(tgt, "release", "nvraid")
    fio = sh([os.path.join(ROOT, "tools", "mdvm", "build-fio")]).stdout.strip()

    work = tempfile.mkdtemp(prefix="ublk-vm-", dir=a.dir)
    try:
        inside = os.path.join(work, "in")
        os.mkdir(inside)
        for b in [nvraid, fio, host_tool("nbd-client")]:
            ship(inside, b)
        disks = [os.path.join(work, f"d{i}.img") for i in range(4)]
        first = levels[0]
        create = [nvraid, "create", "--level", first, "--chunk", "64K", "--size", f"{a.disk_mib}M", *disks]
        sh(create)
        script = os.path.join(work, "bench.sh")
        with open(script, "w") as f:
            f.write(GUEST)
        outdir = os.path.join(work, "out")
        workloads = " ".join(f"{n}:{rw}:{bs}:{qd}:{jobs}" for n, rw, bs, qd, jobs in WORKLOADS)
        env = {"LEVELS": " ".join(levels), "RUNTIME": a.runtime, "RAMP": a.ramp, "REPS": a.reps,
               "WORKLOADS": workloads, "CONNS": a.smp}
        cmd = [MDVM, "--kernel", "6.12", "--modules", "ublk_drv nbd", "--smp", str(a.smp), "--mem", a.mem,
               "--timeout", "1500", "--indir", inside, "--outdir", outdir, "--script", script]
        for k, v in env.items():
            cmd += ["--env", f"{k}={v}"]
        cmd += disks
        load0 = os.getloadavg()
        t0 = time.time()
        print(f"booting the 6.12 VM: {a.smp} vCPUs, 4 x {a.disk_mib} MiB disks in {a.dir}, "
              f"runs of {a.ramp}+{a.runtime} s ...", flush=True)
        vm = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        console = []
        guest = ""
        for line in vm.stdout:
            console.append(line)
            if line.startswith(("GUEST", "SERVED", "MD ", "RAN", "STATUS", "FAIL", "DONE")):
                print("  " + line.rstrip(), flush=True)
            if line.startswith("GUEST"):
                guest = line.split()[1].split("=")[1]
        err = vm.stderr.read()
        rc = vm.wait()
        elapsed = time.time() - t0
        if rc != 0 or "DONE\n" not in console:
            sys.exit(f"the VM run failed (mdvm exit {rc}):\n{''.join(console[-60:])}\n{err}")

        results = {}  # level -> workload -> target -> {iops, mb_s, reps}
        for level in levels:
            for name, *_ in WORKLOADS:
                for target in TARGETS:
                    reps = []
                    for rep in range(1, a.reps + 1):
                        p = os.path.join(outdir, f"{target}-{level}-{name}-{rep}.json")
                        if os.path.exists(p):
                            reps.append(load(p))
                    if not reps:
                        continue
                    iops = statistics.median(r[0] for r in reps)
                    bw = statistics.median(r[1] for r in reps)
                    results.setdefault(level, {}).setdefault(name, {})[target] = {
                        "iops": iops, "mb_s": bw / 1e6, "reps_iops": [r[0] for r in reps]}

        def ratio(level, name, num, den):
            """num / den; for ublk / nbd (alternated) the median of the repetitions' ratios."""
            r = results[level][name]
            if num not in r or den not in r or not all(r[den]["reps_iops"]):
                return None
            pairs = list(zip(r[num]["reps_iops"], r[den]["reps_iops"]))
            if len(r[num]["reps_iops"]) == len(r[den]["reps_iops"]) > 1:
                return statistics.median(x / y for x, y in pairs)
            return r[num]["iops"] / r[den]["iops"]

        def rep_ratios(level, name):
            r = results[level][name]
            return [x / y for x, y in zip(r["ublk"]["reps_iops"], r["nbd"]["reps_iops"])]

        print()
        print(f"RAID 0/5 of 4 x {a.disk_mib} MiB virtio disks, 64 KiB chunks; guest {guest}, {a.smp} vCPUs, "
              f"fio {a.ramp}+{a.runtime} s, io_uring, direct; {a.reps} rep(s); VM run {elapsed:.0f} s")
        hdr = f"{'level':6} {'workload':13}" + "".join(f"{t + ' IOPS':>11} {'MB/s':>7}" for t in TARGETS)
        hdr += f"{'ublk/nbd':>10}{'ublk/md':>9}{'ublk/bench':>11}"
        print(hdr)
        ratios = {}
        for level in levels:
            for name, *_ in WORKLOADS:
                r = results[level][name]
                row = f"raid{level:2} {name:13}"
                for t in TARGETS:
                    row += f"{r[t]['iops']:11.0f} {r[t]['mb_s']:7.1f}" if t in r else f"{'-':>11} {'-':>7}"
                for num, den, w in [("ublk", "nbd", 10), ("ublk", "md", 9), ("ublk", "bench", 11)]:
                    x = ratio(level, name, num, den)
                    ratios.setdefault(level, {}).setdefault(name, {})[f"{num}/{den}"] = x
                    row += f"{x:{w}.3f}" if x is not None else f"{'-':>{w}}"
                print(row)
        print()
        print("issue 31's targets:")
        goals = []
        for level in levels:
            for name, which, need in GOALS:
                x = ratios[level][name][which]
                met = x is not None and x >= need
                reps = rep_ratios(level, name) if which == "ublk/nbd" else []
                goals.append({"level": int(level), "workload": name, "ratio": which, "value": x,
                              "reps": reps, "target": need, "met": met})
                each = f"  ({' '.join(f'{y:.2f}' for y in reps)})" if len(reps) > 1 else ""
                print(f"  raid{level} {name:13} {which:10} {x:6.3f}  target >= {need:.3f}  "
                      f"{'met' if met else 'NOT met'}{each}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({
                    "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
                    "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                    "host": {"nproc": os.cpu_count(), "cpu_model": cpu_model(), "kernel": platform.release(),
                             "loadavg_before": load0, "loadavg_after": os.getloadavg()},
                    "guest": {"kernel": guest, "smp": a.smp, "mem": a.mem, "accel": "mdvm's auto (TCG where KVM does not boot a guest)"},
                    "setup": {"disks": 4, "disk_mib": a.disk_mib, "dir": a.dir, "chunk_kib": 64,
                              "runtime_s": a.runtime, "ramp_s": a.ramp, "reps": a.reps,
                              "nbd_connections": a.smp,
                              "workloads": [dict(zip(["name", "rw", "bs", "iodepth", "numjobs"], w))
                                            for w in WORKLOADS]},
                    "vm_seconds": elapsed,
                    "results": results, "ratios": ratios, "goals": goals}, f, indent=1)
            print(f"wrote {a.json}")
    finally:
        if a.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


if __name__ == "__main__":
    main()
