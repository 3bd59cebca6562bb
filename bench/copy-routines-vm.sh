#!/usr/bin/env bash
# Which copy routines the 6.12 guest kernel picks, and what they cost under
# TCG, for each qemu CPU model given (default: "max" and "max,-erms,-fsrm").
# One tools/mdvm boot per model (2 vCPUs); per model it prints the guest's
# copy-related CPU flags, the instructions at the large-copy branch of
# rep_movs_alternative (the kernel's copy to and from user memory) and at
# memcpy's entry (disassembled here with objdump), six timed 64 MiB read()s
# of a tmpfs file in 1 MiB pieces (the copy to user memory), and three
# rounds of `perf bench mem memcpy` (the host's perf, shipped into the
# guest) for the unrolled, movsq and movsb kernel routines and glibc's.
# Reading the disassembly (6.12's arch/x86/lib): in rep_movs_alternative the
# instruction just before the second `ret` is the branch for copies of 64
# bytes and more: `rep movsb` when the kernel saw ERMS, a `jmp` to the
# `rep movsq` loop below when not. memcpy starts with a `jmp` to the
# unrolled memcpy_orig unless the CPU has FSRM (then `rep movsb`).
#
# Usage: bench/copy-routines-vm.sh [CPU-MODEL ...]
# Needs: gcc (static), perf (linux-perf), objdump, xxd, qemu (tools/mdvm).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[ $# -gt 0 ] || set -- max max,-erms,-fsrm
command -v perf > /dev/null || { echo "needs perf (apt-get install linux-perf)" >&2; exit 1; }
W=$(mktemp -d /tmp/copy-routines.XXXXXX)
trap 'rm -rf "$W"' EXIT
mkdir "$W/in"
gcc -O2 -static -o "$W/in/copycheck" "$ROOT/bench/copy-routines-vm.c"
PERF=$(command -v perf)
cp "$PERF" "$W/in/perf"
# perf's libraries, not libc (the guest's).
ldd "$PERF" | awk '/=>/ && $3 !~ /\/libc\.so/ {print $3}' | xargs -r cp -t "$W/in/"
truncate -s 16M "$W/unused.img"
cat > "$W/guest.sh" << 'GUEST'
set -e
echo "FLAGS $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'erms|fsrm|rep_good' | tr '\n' ' ')"
mkdir -p /tmp/rd
$MDVM_IN/copycheck /tmp/rd/f
$MDVM_IN/copycheck /tmp/rd/f | grep READ
export LD_LIBRARY_PATH=$MDVM_IN
for i in 1 2 3; do
	for f in x86-64-unrolled x86-64-movsq x86-64-movsb default; do
		echo "MEMCPY $f $($MDVM_IN/perf bench mem memcpy -s 8MB -l 10 -f $f 2>&1 | grep -E 'B/sec')"
	done
done
echo DONE
GUEST
for cpu in "$@"; do
	echo "=== CPU model $cpu"
	"$ROOT/tools/mdvm/mdvm" --kernel 6.12 --smp 2 --mem 1G --cpu "$cpu" --timeout 600 \
		--indir "$W/in" --script "$W/guest.sh" "$W/unused.img" > "$W/out.log"
	grep -v '^KDUMP' "$W/out.log"
	grep '^KDUMP' "$W/out.log" | while read -r _ name addr hex; do
		[ "$addr" != none ] && [ "$addr" != nomap ] || { echo "$name: not found"; continue; }
		echo "$hex" | xxd -r -p > "$W/k.bin"
		echo "-- $name (from /proc/kcore)"
		objdump -D -b binary -mi386:x86-64 --adjust-vma="0x$addr" "$W/k.bin" |
			grep -E "rep movs|jmp|ret"
	done
done
