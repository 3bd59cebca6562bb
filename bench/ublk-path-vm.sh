#!/usr/bin/env bash
# Where the time of a 4K read through /dev/ublkbN goes, in tools/mdvm's
# Linux 6.12 VM (TCG). One boot; RAM disks (brd) as members, so that no
# emulated disk is in the way; fio (io_uring, direct, 4K random read, QD 32)
# in the guest on:
#
#   nullb0   null_blk: a device that does nothing (fio + the block layer)
#   ram0     one RAM disk (fio + the block layer + a 4K copy)
#   md       kernel md RAID 0 of the 4 RAM disks (64 KiB chunks)
#   ublk     nvraid serve --ublk over the same RAID 0 (nvraid's format)
#
# and nvraid's own bench on the array (in-process, no block device), each
# with 1 job against 1 worker and with 2 jobs against 2 workers. Prints
# one RESULT line per run.
#
#   bench/ublk-path-vm.sh [--reps N] [--runtime S]
# Environment: NVRAID (the binary; default: cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=1
RUNTIME=4
while [ $# -gt 0 ]; do
	case $1 in
	--reps) REPS=$2; shift 2 ;;
	--runtime) RUNTIME=$2; shift 2 ;;
	*) echo "usage: $0 [--reps N] [--runtime S]" >&2; exit 2 ;;
	esac
done
if [ -z "${NVRAID:-}" ]; then
	cargo build --release -q -p nvraid
	NVRAID=${CARGO_TARGET_DIR:-target}/release/nvraid
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/in"
cp "$(tools/mdvm/build-fio)" "$work/in/fio"
cp "$NVRAID" "$work/in/nvraid"
for lib in $(ldd "$NVRAID" | awk '/=>/ {print $3}'); do
	case $lib in */libc.so*) ;; *) cp -n "$lib" "$work/in/" ;; esac
done
truncate -s 16M "$work/unused.img"
cat > "$work/guest.sh" <<GUEST
export LD_LIBRARY_PATH=\$MDVM_IN
N=\$MDVM_IN/nvraid
RAMS="/dev/ram0 /dev/ram1 /dev/ram2 /dev/ram3"
fio_on() { # NAME DEV JOBS
	\$MDVM_IN/fio --name=\$1 --filename=\$2 --ioengine=io_uring --direct=1 --rw=randread --bs=4k \\
		--iodepth=32 --numjobs=\$3 --group_reporting --time_based --runtime=$RUNTIME --ramp_time=1 \\
		--norandommap --randrepeat=0 > /tmp/fio.out 2>&1 || { cat /tmp/fio.out; exit 1; }
	echo "RESULT \$1 jobs=\$3 rep=\$rep \$(grep -o 'IOPS=[^,]*' /tmp/fio.out) cpu: \$(grep -o 'usr=[^,]*, sys=[^,]*' /tmp/fio.out)"
}
modprobe null_blk nr_devices=1
modprobe brd rd_nr=4 rd_size=65536
\$N create --level 0 --chunk 64K --force \$RAMS > /dev/null 2>&1 || exit 1
rep=1
while [ \$rep -le $REPS ]; do
	for jobs in 1 2; do
		fio_on nullb0 /dev/nullb0 \$jobs
		fio_on ram0 /dev/ram0 \$jobs
		\$N bench --rw randread --bs 4k --iodepth 32 --numjobs \$jobs --runtime ${RUNTIME}s --ramp 1s \\
			--destructive \$RAMS 2>&1 | sed -n "s/^ *read: \\(IOPS=[0-9.]*\\).*/RESULT bench jobs=\$jobs rep=\$rep \\1/p"
		\$N serve --ublk 0 --workers \$jobs \$RAMS 2> /tmp/srv.log &
		srv=\$!
		n=0
		while [ ! -b /dev/ublkb0 ]; do n=\$((n + 1)); [ \$n -lt 300 ] || { cat /tmp/srv.log; exit 1; }; sleep 0.1; done
		fio_on ublk /dev/ublkb0 \$jobs
		kill -TERM \$srv
		wait \$srv || { cat /tmp/srv.log; exit 1; }
	done
	rep=\$((rep + 1))
done
mdadm --create /dev/md0 --run --metadata=1.2 --level=0 --chunk=64 --raid-devices=4 \$RAMS > /dev/null 2>&1 || exit 1
rep=1
while [ \$rep -le $REPS ]; do
	for jobs in 1 2; do fio_on md /dev/md0 \$jobs; done
	rep=\$((rep + 1))
done
echo DONE
GUEST
tools/mdvm/mdvm --kernel 6.12 --modules "ublk_drv null_blk brd" --smp 2 --mem 2G \
	--indir "$work/in" --script "$work/guest.sh" "$work/unused.img" 2>&1 | grep -E "^(RESULT|DONE)|rror" || true
echo "host: $(nproc) CPUs, $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1), $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
