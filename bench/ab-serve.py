#!/usr/bin/env python3
"""Two nvraid binaries' `serve`, one after the other on one array, through
fio's nbd engine (an A/B check that a change to the server did not slow it).

    bench/ab-serve.py OLD_NVRAID NEW_NVRAID [--reps 5] [--runtime 4] [--jobs 2]

A RAID 0 of 4 x 256 MiB tmpfs files (/dev/shm) is served by each binary in
turn (the order alternates per repetition), on a Unix socket, and fio runs
4K random read and 4K random write at QD 32 per connection (`--jobs`
connections). Prints new/old IOPS per repetition and the median ratio,
and each server's CPU time per request (user + system, from /proc: less
swayed by other load on the machine than IOPS are).
"""
import argparse, json, os, shutil, statistics, subprocess, tempfile, time

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("old")
ap.add_argument("new")
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--runtime", type=int, default=4)
ap.add_argument("--jobs", type=int, default=2)
a = ap.parse_args()
if shutil.which("fio") is None:
    subprocess.run(["apt-get", "install", "-y", "-qq", "fio"], check=True)

work = tempfile.mkdtemp(prefix="ab-serve-", dir="/dev/shm")
members = [os.path.join(work, f"m{i}") for i in range(4)]
subprocess.run([a.new, "create", "--level", "0", "--size", "256M", *members],
               check=True, stdout=subprocess.DEVNULL)
sock = os.path.join(work, "s.sock")


def cpu_seconds(pid):
    # utime and stime, fields 14 and 15 of /proc/PID/stat, in clock ticks.
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(binary, rw):
    server = subprocess.Popen([binary, "serve", "--listen", f"unix:{sock}", *members],
                              stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        cpu0 = cpu_seconds(server.pid)
        out = os.path.join(work, "fio.json")
        subprocess.run(["fio", "--name=ab", "--ioengine=nbd", f"--uri=nbd+unix:///?socket={sock}",
                        f"--rw={rw}", "--bs=4k", "--iodepth=32", f"--numjobs={a.jobs}",
                        "--group_reporting", "--time_based", f"--runtime={a.runtime}",
                        "--output-format=json", f"--output={out}"], check=True)
        cpu = cpu_seconds(server.pid) - cpu0
        job = json.load(open(out))["jobs"][0]
        ios = job["read"]["total_ios"] + job["write"]["total_ios"]
        return job["read"]["iops"] + job["write"]["iops"], cpu / max(ios, 1) * 1e6
    finally:
        server.terminate()
        server.wait()
        if os.path.exists(sock):
            os.unlink(sock)


try:
    for rw in ["randread", "randwrite"]:
        ratios, olds, news, cpu = [], [], [], {"old": [], "new": []}
        for rep in range(a.reps):
            order = ["old", "new"] if rep % 2 == 0 else ["new", "old"]
            got = {who: run(a.old if who == "old" else a.new, rw) for who in order}
            olds.append(got["old"][0]); news.append(got["new"][0])
            for who in cpu:
                cpu[who].append(got[who][1])
            ratios.append(got["new"][0] / got["old"][0])
            print(f"  {rw}: old {got['old'][0]:.0f} IOPS {got['old'][1]:.2f} us/req | "
                  f"new {got['new'][0]:.0f} IOPS {got['new'][1]:.2f} us/req | "
                  f"new/old {ratios[-1]:.3f}", flush=True)
        old_cpu, new_cpu = statistics.median(cpu["old"]), statistics.median(cpu["new"])
        print(f"{rw} 4K QD32 x{a.jobs}: new/old IOPS median {statistics.median(ratios):.3f} "
              f"(old {statistics.median(olds):.0f}, new {statistics.median(news):.0f}); "
              f"server CPU per request old {old_cpu:.2f} us, new {new_cpu:.2f} us "
              f"(new/old {new_cpu / old_cpu:.3f})", flush=True)
finally:
    shutil.rmtree(work)
