#!/usr/bin/env python3
"""RAID 0 over NVMe/TCP members next to fio on the kernel initiator's devices
for the same namespaces, in one run, in tools/mdvm's Linux 6.12 VM (issue
34's first target; this host's kernel has no nvmet).

In one boot (TCG unless the host has KVM; 2 vCPUs):

  four nvmet-tcp subsystems of the guest kernel on 127.0.0.1:4420, each one
  namespace on a memory-backed null_blk disk (512-byte blocks), configured
  through configfs; the kernel initiator (nvme_tcp) attached to all four
  through /dev/nvme-fabrics (no nvme-cli), giving /dev/nvmeXn1;
  four nbdkit servers (file plugin) on 127.0.0.1:10810.. over the same
  null_blk disks: the NBD members on the same storage;
  an nvraid RAID 0 (64 KiB chunks) over the four nvme+tcp:// members.

Then, alternating in each repetition, for 4K random read (QD 32, target
>= 1.0), 4K random write (QD 32, >= 0.95) and 1 MiB sequential read (QD 8,
>= 0.95):

  fio      io_uring, O_DIRECT, one job per /dev/nvmeXn1 (the namespaces as
           JBOD) at QD/4 each, past each namespace's first MiB
  nvraid   nvraid bench on the RAID 0 of the nvme+tcp:// members, 2 workers
           at QD/2 each
  before   the same with the binary given by --before (e.g. the commit
           before a change: a before/after measurement in the same boot)
  nbd      nvraid bench on the same RAID 0 reached through the nbd://
           members (nbdkit over the same disks): the NVMe/TCP member vs the
           NBD member on the same storage

Reported per row: the median over the repetitions of nvraid / fio (the
verdict against the target), nvraid / before, and nvme / nbd.

With --profile ROWS, perf (the host's, shipped into the guest) records
nvraid bench on those rows afterwards (cpu-clock: TCG has no PMU) and the
flat profile is printed.

With --trace ROWS, the guest kernel's tracepoints (tracefs, the whole
guest) are recorded while fio and then nvraid run each of those rows once
more, and the script prints, per side: the commands the target (nvmet) received,
their mean size, the I/O queues they came on and how many commands were
executing at the target on the same queue when each arrived (nvmet's
trace completes a command when its backend does, before its data is sent:
on null_blk that is at once, so this is not the host's queue depth), socket
copies to their destination (skb_copy_datagram_iovec: the kernel
initiator's and nvraid's alike) with their mean size, context switches,
and the guest's CPU ticks (/proc/stat: user, system, softirq, idle), per
MiB through the target; for nvraid also its read calls and the bytes they
returned (/proc/PID/io) and its threads' context switches. (Syscall
tracepoints are asked for too but recorded nothing in this guest.)

With --cpu MODEL the VM runs with that qemu CPU model and its feature flags
(tools/mdvm --cpu; default: mdvm's, `max` under TCG). `--cpu
max,-erms,-fsrm` hides ERMS and FSRM from the guest, so that its kernel
copies to user memory with `rep movsq` instead of `rep movsb`: under TCG
that changes what one emulated instruction costs, not nvraid's path (see
docs/PERFORMANCE.md, "1 MiB reads, traced").

Usage: bench/nvme-tcp-vm.py [--reps 3] [--runtime 4] [--before BIN]
                            [--rows randread,randwrite,read] [--json out.json]
                            [--profile randread,...] [--trace read,...]
                            [--cpu MODEL]
Environment: NVRAID (the binary; default: cargo build --release).
"""
import argparse, importlib.util, json, os, re, shutil, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("vsfio", os.path.join(ROOT, "bench", "vs-fio.py"))
vsfio = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vsfio)

ROWS = {
    "randread": ("4k", 32, 1.0, "4K random read, QD 32"),
    "randwrite": ("4k", 32, 0.95, "4K random write, QD 32"),
    "read": ("1M", 8, 0.95, "1 MiB sequential read, QD 8"),
}
NQN = "nqn.2026-11.io.nvraid.bench"
DISK_MB = 256


def nvraid_binary():
    if os.environ.get("NVRAID"):
        return os.environ["NVRAID"]
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "nvraid"], cwd=ROOT, check=True)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    return os.path.join(target, "release", "nvraid")


def ship(indir, path, name):
    """Copy an executable and the libraries it needs (not libc: the
    guest's) into the VM's directory."""
    shutil.copy(path, os.path.join(indir, name))
    out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
    for m in re.finditer(r"=> (\S+)", out):
        lib = m.group(1)
        dest = os.path.join(indir, os.path.basename(lib))
        if "/libc.so" not in lib and not os.path.exists(dest):
            shutil.copy(lib, dest)


TRACE_EVENTS = ["nvmet:nvmet_req_init", "nvmet:nvmet_req_complete", "syscalls:sys_exit_readv",
                "syscalls:sys_exit_recvmsg", "syscalls:sys_exit_recvfrom",
                "syscalls:sys_enter_poll", "syscalls:sys_enter_ppoll",
                "syscalls:sys_enter_io_uring_enter", "skb:skb_copy_datagram_iovec",
                "sched:sched_switch"]

# Summarises the guest's trace of the traced run (tracefs; busybox awk):
# per event, the count; nvmet commands' size (their `len` is blocks - 1,
# of 512 bytes here) and the commands already in flight on their queue
# (per controller and qid) when each arrived; bytes returned by receive
# syscalls; bytes per socket copy.
TRACE_AWK = r"""
BEGIN {
	n = split("EVENTS", all, " ")
	for (k = 1; k <= n; k++) { e = all[k]; sub(/^[a-z_]+:/, "", e); known[e ":"] = all[k] }
}
function hex(t,    v, k) {
	gsub(/[^0-9a-fA-F]/, "", t); t = tolower(t); v = 0
	for (k = 1; k <= length(t); k++) v = v * 16 + index("0123456789abcdef", substr(t, k, 1)) - 1
	return v
}
{
	ev = ""
	for (i = 1; i <= NF; i++) if (($i ":") ~ /^[a-z_0-9]+::$/ && ($i in known)) { ev = known[$i]; break }
	if (ev == "") next
	count[ev]++
	if (!(ev in sample)) sample[ev] = $0
	if (ev == "nvmet:nvmet_req_init" || ev == "nvmet:nvmet_req_complete") {
		ctrl = ""; qid = ""
		# Formatted (nvmetN: ... qid=Q, ...) or raw (ctrl=0x... qid=Q ...:
		# a reader without nvmet's print helpers, e.g. perf's libtraceevent).
		for (j = i + 1; j <= NF; j++) {
			if (ctrl == "" && ($j ~ /^nvmet[0-9]/ || $j ~ /^ctrl=/)) ctrl = $j
			if (qid == "" && $j ~ /^qid=/) { qid = $j; sub(/,$/, "", qid) }
		}
		key = ctrl qid
		if (qid == "qid=0") next
		if (ev == "nvmet:nvmet_req_init") {
			if (!(key in seen)) { seen[key] = 1; queues++ }
			depth += inflight[key]; cmds++
			inflight[key]++
			if (match($0, /len=[0-9]+/)) { lens += substr($0, RSTART + 4, RLENGTH - 4) + 1; nlen++ }
			else if (match($0, /cdw10=ARRAY\[[^]]*\]/)) {
				# Raw: CDW10..15 as bytes; a Read's NLB is CDW12's low half.
				n = split(substr($0, RSTART + 12, RLENGTH - 13), by, ",")
				if (n >= 10) { lens += hex(by[9]) + 256 * hex(by[10]) + 1; nlen++ }
			}
		} else if (inflight[key] > 0) inflight[key]--
	}
	if (ev ~ /sys_exit_(readv|recvmsg|recvfrom)/ && match($0, /0x[0-9a-f]+$/)) {
		v = 0; h = substr($0, RSTART + 2, RLENGTH - 2)
		for (k = 1; k <= length(h); k++) v = v * 16 + index("0123456789abcdef", substr(h, k, 1)) - 1
		if (v < 1099511627776) { rbytes += v; recvs++ }
	}
	if (ev == "skb:skb_copy_datagram_iovec" && match($0, /len=[0-9]+/)) {
		cbytes += substr($0, RSTART + 4, RLENGTH - 4); copies++
	}
}
END {
	for (e in count) printf "EVENT %s %d\n", e, count[e]
	for (e in sample) printf "SAMPLE %s\n", sample[e]
	printf "QUEUES %d\n", queues
	if (cmds) printf "DEPTH %.2f\n", depth / cmds
	if (nlen) printf "CMDBYTES %.0f\n", lens * 512 / nlen
	if (recvs) printf "RECVBYTES %.0f %d\n", rbytes / recvs, recvs
	if (copies) printf "COPYBYTES %.0f\n", cbytes / copies
}
"""


def guest_script(rows, reps, runtime, before, profile, trace=()):
    runs = []
    for rw in rows:
        bs, depth, _, _ = ROWS[rw]
        runs.append(f"""
	fio_run {rw} {bs} {depth // 4}
	bench_run nvraid nvraid {rw} {bs} {depth // 2} "$M"
	{f'bench_run before nvraid-before {rw} {bs} {depth // 2} "$M"' if before else ''}
	bench_run nbd nvraid {rw} {bs} {depth // 2} "$B"
""")
    profiles = ""
    for rw in profile:
        bs, depth, _, _ = ROWS[rw]
        profiles += f"""
# A flat profile (cpu-clock samples: no PMU under TCG) of nvraid bench.
$MDVM_IN/perf record -q -e cpu-clock -F 2000 -o /tmp/perf.data -- $MDVM_IN/nvraid bench --rw {rw} \\
	--bs {bs} --iodepth {depth // 2} --numjobs 2 --runtime {runtime}s --destructive $M \\
	> /tmp/perf-bench.log 2>&1 || {{ cat /tmp/perf-bench.log; exit 1; }}
echo "PROFILE {rw}"
$MDVM_IN/perf report -i /tmp/perf.data --stdio --no-children --sort dso,sym 2> /dev/null \\
	| grep -v '^#' | grep -v '^$' | head -45
echo "PROFILE END"
"""
    traces = ""
    events = " ".join(e.replace(":", "/") for e in TRACE_EVENTS)
    for rw in trace:
        bs, depth, _, _ = ROWS[rw]
        for who, cmd in (("fio", f"fio_run {rw} {bs} {depth // 4}"),
                         ("nvraid", f'bench_run nvraid nvraid {rw} {bs} {depth // 2} "$M"')):
            traces += f"""
rep=trace
T=/sys/kernel/tracing
echo 0 > $T/tracing_on
echo 65536 > $T/buffer_size_kb
echo > $T/trace
for e in {events}; do echo 1 > $T/events/$e/enable 2> /dev/null || echo "TRACEMISS $e" >> /tmp/trace-miss; done
S0=$(head -1 /proc/stat)
echo 1 > $T/tracing_on
rm -f /tmp/proc.last
{cmd} > /dev/null &
W=$!
# nvraid's own counters, read until it exits: read(v) calls and the bytes
# they returned (/proc/PID/io, every thread), and its threads' context
# switches.
while kill -0 $W 2> /dev/null; do
	P=$(pidof nvraid 2> /dev/null | cut -d' ' -f1)
	if [ -n "$P" ]; then
		{{ cat /proc/$P/io; cat /proc/$P/task/*/status | grep ctxt_switches; }} > /tmp/proc.now 2> /dev/null \
			&& mv /tmp/proc.now /tmp/proc.last
	fi
	sleep 0.2
done
wait $W
echo 0 > $T/tracing_on
S1=$(head -1 /proc/stat)
for e in {events}; do echo 0 > $T/events/$e/enable 2> /dev/null || true; done
echo "TRACE {who} {rw}"
echo "STAT0 $S0"
echo "STAT1 $S1"
[ -f /tmp/proc.last ] && awk '{{ k = $1; sub(/:$/, "", k); sum[k] += $2 }} END {{ for (k in sum) print "PROC", k, sum[k] }}' /tmp/proc.last
cat /tmp/trace-miss 2> /dev/null || true
rm -f /tmp/trace-miss
awk -f /tmp/trace.awk $T/trace
echo "TRACE END"
"""
    return f"""set -e
export LD_LIBRARY_PATH=$MDVM_IN
mountpoint -q /sys/kernel/tracing 2> /dev/null || mount -t tracefs nodev /sys/kernel/tracing 2> /dev/null || true
mountpoint -q /sys/kernel/debug 2> /dev/null || mount -t debugfs nodev /sys/kernel/debug 2> /dev/null || true
cat > /tmp/trace.awk << 'AWKEOF'
{TRACE_AWK.replace("EVENTS", " ".join(TRACE_EVENTS))}
AWKEOF
ip link set lo up 2> /dev/null || ifconfig lo 127.0.0.1 up
# The copy-related CPU flags the guest kernel sees (they pick its copy routines).
echo "CPUFLAGS $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\\n' | grep -xE 'erms|fsrm|rep_good' | tr '\\n' ' ')"
[ -d /sys/kernel/config/nvmet ] || mount -t configfs none /sys/kernel/config
NB=/sys/kernel/config/nullb
C=/sys/kernel/config/nvmet
NQN={NQN}
M=""
B=""
for i in 0 1 2 3; do
	mkdir $NB/nvr$i
	echo 1 > $NB/nvr$i/memory_backed
	echo 512 > $NB/nvr$i/blocksize
	echo {DISK_MB} > $NB/nvr$i/size
	echo 1 > $NB/nvr$i/power
	n=0; while [ ! -b /dev/nvr$i ]; do n=$((n + 1)); [ $n -lt 100 ] || exit 1; sleep 0.1; done
	S=$C/subsystems/$NQN:d$i
	mkdir $S
	echo 1 > $S/attr_allow_any_host
	mkdir $S/namespaces/1
	echo /dev/nvr$i > $S/namespaces/1/device_path
	echo 1 > $S/namespaces/1/enable
	M="$M nvme+tcp://127.0.0.1/$NQN:d$i"
	B="$B nbd://127.0.0.1:1081$i"
	$MDVM_IN/nbdkit -f -i 127.0.0.1 -p 1081$i $MDVM_IN/nbdkit-file-plugin.so file=/dev/nvr$i > /tmp/nbdkit$i.log 2>&1 &
done
P=$C/ports/1
mkdir $P
echo tcp > $P/addr_trtype
echo ipv4 > $P/addr_adrfam
echo 127.0.0.1 > $P/addr_traddr
echo 4420 > $P/addr_trsvcid
for i in 0 1 2 3; do ln -s $C/subsystems/$NQN:d$i $P/subsystems/$NQN:d$i; done
$MDVM_IN/nvraid create --level 0 --chunk 64K --force $M > /tmp/create.log 2>&1 || {{ cat /tmp/create.log; exit 1; }}
# The kernel's initiator on the same four namespaces.
for i in 0 1 2 3; do
	echo "transport=tcp,traddr=127.0.0.1,trsvcid=4420,nqn=$NQN:d$i" > /dev/nvme-fabrics
done
n=0
while [ $(ls /dev/nvme*n1 2> /dev/null | wc -l) -lt 4 ]; do n=$((n + 1)); [ $n -lt 100 ] || exit 1; sleep 0.1; done
DEVS=$(ls /dev/nvme*n1)
echo "KERNEL namespaces:" $DEVS
fio_run() {{ # ROW BS QD_PER_JOB
	args=""
	k=0
	for d in $DEVS; do args="$args --name=ns$k --filename=$d"; k=$((k + 1)); done
	$MDVM_IN/fio --ioengine=io_uring --direct=1 --rw=$1 --bs=$2 --iodepth=$3 --offset=1M \\
		--time_based --runtime={runtime} --ramp_time=1 --norandommap --randrepeat=0 \\
		--group_reporting --output-format=json --output=/tmp/out.json $args > /tmp/fio.log 2>&1 \\
		|| {{ cat /tmp/fio.log; exit 1; }}
	echo "BEGIN fio $1 $rep"; cat /tmp/out.json; echo "END"
}}
bench_run() {{ # WHO BINARY ROW BS QD_PER_WORKER MEMBERS
	$MDVM_IN/$2 --nbd-timeout 30s --nbd-connect-timeout 20s bench --json --rw $3 --bs $4 \\
		--iodepth $5 --numjobs 2 --runtime {runtime}s --ramp 1s --destructive $6 > /tmp/out.json 2> /tmp/bench.log \\
		|| {{ cat /tmp/bench.log; exit 1; }}
	echo "BEGIN $1 $3 $rep"; cat /tmp/out.json; echo "END"
}}
rep=1
while [ $rep -le {reps} ]; do
{''.join(runs)}
	rep=$((rep + 1))
done
{profiles}
{traces}
echo DONE
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--runtime", type=int, default=4)
    ap.add_argument("--before", help="a second nvraid binary, benched beside the first")
    ap.add_argument("--rows", default="randread,randwrite,read")
    ap.add_argument("--json")
    ap.add_argument("--profile", default="",
                    help="rows to profile with perf after the runs (comma-separated)")
    ap.add_argument("--trace", default="",
                    help="rows to trace (the guest's tracepoints) after the runs")
    ap.add_argument("--cpu", help="qemu CPU model and flags for the VM (tools/mdvm --cpu), "
                    "e.g. max,-erms,-fsrm; default: mdvm's (max under TCG)")
    a = ap.parse_args()
    profile = [r for r in a.profile.split(",") if r]
    trace = [r for r in a.trace.split(",") if r]
    rows = a.rows.split(",")
    for r in rows + profile + trace:
        if r not in ROWS:
            sys.exit(f"unknown row {r!r} (one of {', '.join(ROWS)})")
    nbdkit = shutil.which("nbdkit")
    plugin = "/usr/lib/x86_64-linux-gnu/nbdkit/plugins/nbdkit-file-plugin.so"
    if not nbdkit or not os.path.exists(plugin):
        sys.exit("needs nbdkit and its file plugin (apt-get install nbdkit)")
    work = tempfile.mkdtemp(prefix="nvme-tcp-vm-")
    try:
        indir = os.path.join(work, "in")
        os.mkdir(indir)
        fio = subprocess.run([os.path.join(ROOT, "tools/mdvm/build-fio")], capture_output=True,
                             text=True, check=True).stdout.strip()
        shutil.copy(fio, os.path.join(indir, "fio"))
        ship(indir, nvraid_binary(), "nvraid")
        if a.before:
            ship(indir, a.before, "nvraid-before")
        ship(indir, nbdkit, "nbdkit")
        ship(indir, plugin, "nbdkit-file-plugin.so")
        if profile:
            perf = shutil.which("perf")
            if not perf:
                sys.exit("--profile needs perf (apt-get install linux-perf)")
            ship(indir, perf, "perf")
        with open(os.path.join(work, "unused.img"), "wb") as f:
            f.truncate(16 << 20)
        script = os.path.join(work, "guest.sh")
        with open(script, "w") as f:
            f.write(guest_script(rows, a.reps, a.runtime, a.before, profile, trace))
        per_rep = len(rows) * (4 if a.before else 3) * (a.runtime + 15) + (len(profile) + 2 * len(trace)) * 90
        r = subprocess.run([os.path.join(ROOT, "tools/mdvm/mdvm"), "--kernel", "6.12", "--modules",
                            "nvmet_tcp nvme_tcp null_blk", "--smp", "2", "--mem", "3G",
                            "--timeout", str(120 + a.reps * per_rep), "--indir", indir,
                            "--script", script]
                           + (["--cpu", a.cpu] if a.cpu else []) + [os.path.join(work, "unused.img")],
                           capture_output=True, text=True)
        console = r.stdout
        if r.returncode != 0 or "DONE" not in console:
            sys.stderr.write(console[-4000:] + r.stderr[-2000:])
            sys.exit(f"the VM run failed (exit {r.returncode})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results = {}
    for m in re.finditer(r"^BEGIN (\S+) (\S+) (\d+)\n(.*?)^END$", console, re.S | re.M):
        who, rw, rep = m.group(1), m.group(2), int(m.group(3))
        text = m.group(4)
        text = text[text.index("{"):]
        results.setdefault(rw, {}).setdefault(who, {})[rep] = vsfio.summarize(
            json.loads(text)["jobs"][0])
    for line in console.splitlines():
        if line.startswith(("KERNEL", "CPUFLAGS")):
            print(line)
    for m in re.finditer(r"^PROFILE (\S+)\n(.*?)^PROFILE END$", console, re.S | re.M):
        print(f"perf profile of nvraid bench, {ROWS[m.group(1)][3]} (in the guest):")
        print(m.group(2), end="")
    traced = {}
    for m in re.finditer(r"^TRACE (\S+) (\S+)\n(.*?)^TRACE END$", console, re.S | re.M):
        who, rw, text = m.group(1), m.group(2), m.group(3)
        t = {"events": {}}
        stat = {}
        for line in text.splitlines():
            f = line.split()
            if f and f[0] in ("STAT0", "STAT1"):
                # cpu user nice system idle iowait irq softirq steal ...
                stat[f[0]] = [int(x) for x in f[2:]]
            if f and f[0] == "PROC":
                t.setdefault("proc", {})[f[1]] = int(f[2])
            if f and f[0] == "EVENT":
                t["events"][f[1]] = int(f[2])
            elif f and f[0] in ("QUEUES", "DEPTH", "CMDBYTES", "COPYBYTES"):
                t[f[0].lower()] = float(f[1])
            elif f and f[0] == "RECVBYTES":
                t["recvbytes"], t["recvs"] = float(f[1]), int(f[2])
        traced.setdefault(rw, {})[who] = t
        for line in text.splitlines():
            if line.startswith(("SAMPLE", "TRACEMISS")):
                print(f"trace {who} {rw}: {line}")
        print(f"trace {who} {rw}: events {t['events']}")
        ev = t["events"]
        mib = ev.get("nvmet:nvmet_req_init", 0) * t.get("cmdbytes", 0) / (1 << 20)
        if "STAT0" in stat and "STAT1" in stat:
            d = [b - a for a, b in zip(stat["STAT0"], stat["STAT1"])]
            idle = d[3] + d[4]
            t["busy_ticks"], t["idle_ticks"] = sum(d[:8]) - idle, idle
            pr = t.get("proc")
            if pr and pr.get("syscr"):
                print(f"trace {who} {rw}: nvraid's read calls {pr['syscr']} returning "
                      f"{pr.get('rchar', 0) / pr['syscr'] / 1024:.1f} KiB each on average, "
                      f"{pr.get('rchar', 0) / (1 << 20):.0f} MiB in all; its threads' context "
                      f"switches: voluntary {pr.get('voluntary_ctxt_switches', 0)}, involuntary "
                      f"{pr.get('nonvoluntary_ctxt_switches', 0)} (sampled every 0.2 s until it exited)")
            print(f"trace {who} {rw}: guest CPU over the run (both vCPUs, USER_HZ ticks): "
                  f"user {d[0]}, system {d[2]}, softirq {d[6]}, idle {idle}; "
                  f"busy per MiB through nvmet {t['busy_ticks'] / mib if mib else float('nan'):.2f}")
        per = (lambda n: n / mib) if mib else (lambda n: float("nan"))
        print(f"trace {ROWS[rw][3]}, {who}: {mib:.0f} MiB through nvmet in "
              f"{ev.get('nvmet:nvmet_req_init', 0)} commands of {t.get('cmdbytes', 0) / 1024:.0f} KiB "
              f"on {t.get('queues', 0):.0f} I/O queues ({t.get('depth', 0):.2f} executing at the "
              f"target on the same queue at each arrival); per MiB: "
              f"socket copies {per(ev.get('skb:skb_copy_datagram_iovec', 0)):.1f} "
              f"(mean {t.get('copybytes', 0) / 1024:.1f} KiB), "
              f"context switches {per(ev.get('sched:sched_switch', 0)):.1f}")
    report = {}
    for rw in rows:
        bs, depth, target, label = ROWS[rw]
        got = results.get(rw, {})
        for who in sorted(got):
            for rep, s in sorted(got[who].items()):
                print(f"{label}: {who:7} rep {rep}: {s['iops']:.0f} IOPS "
                      f"{s['bw_bytes'] / 1e6:.1f} MB/s cpu {s['cpu_cores']:.2f}")

        def ratio(a_, b_):
            pairs = [(got[a_][k]["iops"], got[b_][k]["iops"]) for k in got.get(a_, {})
                     if k in got.get(b_, {})]
            return vsfio.median_ratio(pairs) if pairs else None
        vs_fio = ratio("nvraid", "fio")
        row = {"vs_fio": vs_fio, "target": target, "vs_before": ratio("nvraid", "before"),
               "nvme_vs_nbd": ratio("nvraid", "nbd"), "runs": got}
        report[rw] = row
        verdict = "met" if vs_fio is not None and vs_fio >= target else "NOT met"
        print(f"{label}: nvraid/fio = {vs_fio:.3f} (target >= {target}) {verdict}")
        if row["vs_before"] is not None:
            print(f"{label}: nvraid/before = {row['vs_before']:.3f}")
        print(f"{label}: nvme+tcp/nbd member = {row['nvme_vs_nbd']:.3f}")
    print(f"host: {os.cpu_count()} CPUs, "
          f"{open('/proc/cpuinfo').read().split('model name')[1].split(':')[1].splitlines()[0].strip()}, "
          f"{os.uname().release}; guest: Linux 6.12 (tools/mdvm --kernel 6.12), 2 vCPUs, "
          f"CPU model {a.cpu or 'mdvm default (max under TCG)'}")
    if a.json:
        if traced:
            report["trace"] = traced
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
