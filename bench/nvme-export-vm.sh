#!/usr/bin/env bash
# nvraid's NVMe/TCP export against the kernel's nvmet-tcp exporting the
# same array, in tools/mdvm's Linux 6.12 VM. One boot; RAM disks (brd) as
# the members of a RAID 0 (64 KiB chunks), so that no emulated disk is in
# the way; the kernel's initiator (nvme-tcp, through /dev/nvme-fabrics)
# attaches over 127.0.0.1 and fio (io_uring, direct, 4K, QD 32 per job,
# 2 jobs) runs random reads, then random writes, on its namespace:
#
#   nvraid   nvraid serve --nvme-tcp over the RAID 0
#   nvmet    nvraid serve --ublk over the same RAID 0, /dev/ublkb0 exported
#            by the kernel's nvmet-tcp (configfs)
#
# Prints one RESULT line per run and the ratios nvraid / nvmet (issue 34's
# target: 4K random read and write >= 1.0).
#
#   bench/nvme-export-vm.sh [--reps N] [--runtime S]
# Environment: NVRAID (the binary; default: cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=1
RUNTIME=5
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
HOSTNQN=nqn.2014-08.org.nvraid:bench-host
die() { echo "FAIL: \$*"; cat /tmp/srv.log 2>/dev/null; dmesg | tail -20; exit 1; }
attach() { # PORT NQN: prints the block device
	exec 3<> /dev/nvme-fabrics
	echo "transport=tcp,traddr=127.0.0.1,trsvcid=\$1,nqn=\$2,hostnqn=\$HOSTNQN,hostid=5e1f0c7a-3333-4333-8333-000000000003" >&3 || die "connect \$2"
	read -r answer <&3 || true
	exec 3>&-
	inst=\${answer#instance=}; inst=\${inst%%,*}
	n=0
	while :; do
		for b in /sys/block/nvme*n1; do
			case \${b##*/} in *c*) continue ;; esac
			[ -e "\$b" ] && { echo /dev/\${b##*/}; return; }
		done
		n=\$((n + 1)); [ \$n -lt 300 ] || die "no namespace on nvme\$inst"
		sleep 0.1
	done
}
detach() { for c in /sys/class/nvme/nvme*; do echo 1 > \$c/delete_controller; done; sleep 0.5; }
fio_on() { # NAME DEV RW
	\$MDVM_IN/fio --name=\$1 --filename=\$2 --ioengine=io_uring --direct=1 --rw=\$3 --bs=4k \\
		--iodepth=32 --numjobs=2 --group_reporting --time_based --runtime=$RUNTIME --ramp_time=1 \\
		--norandommap --randrepeat=0 --size=200M > /tmp/fio.out 2>&1 || { cat /tmp/fio.out; exit 1; }
	echo "RESULT \$1 \$3 rep=\$rep \$(grep -o 'IOPS=[^,]*' /tmp/fio.out) cpu: \$(grep -o 'usr=[^,]*, sys=[^,]*' /tmp/fio.out)"
}
ip link set lo up 2> /dev/null || ifconfig lo 127.0.0.1 up
modprobe brd rd_nr=4 rd_size=65536
\$N create --level 0 --chunk 64K --force \$RAMS > /dev/null 2>&1 || die "create"
rep=1
while [ \$rep -le $REPS ]; do
	# nvraid's own export.
	\$N serve --nvme-tcp 127.0.0.1:4420 --workers 2 \$RAMS 2> /tmp/srv.log &
	srv=\$!
	n=0
	while ! grep -q listening-nvme-tcp /tmp/srv.log; do n=\$((n + 1)); [ \$n -lt 300 ] || die "no listener"; sleep 0.1; done
	NQN=\$(sed -n 's/.*event=listening-nvme-tcp address=[^ ]* nqn=//p' /tmp/srv.log)
	dev=\$(attach 4420 \$NQN)
	fio_on nvraid \$dev randread
	fio_on nvraid \$dev randwrite
	detach
	kill -TERM \$srv; wait \$srv || die "nvraid serve --nvme-tcp failed"
	# The kernel's nvmet-tcp over the same array as /dev/ublkb0.
	\$N serve --ublk 0 --workers 2 \$RAMS 2> /tmp/srv.log &
	srv=\$!
	n=0
	while [ ! -b /dev/ublkb0 ]; do n=\$((n + 1)); [ \$n -lt 300 ] || die "no ublkb0"; sleep 0.1; done
	mount -t configfs none /sys/kernel/config 2>/dev/null || true
	S=/sys/kernel/config/nvmet/subsystems/nqn.2014-08.org.bench:kernel
	mkdir -p \$S/namespaces/1
	echo 1 > \$S/attr_allow_any_host
	echo /dev/ublkb0 > \$S/namespaces/1/device_path
	echo 1 > \$S/namespaces/1/enable
	P=/sys/kernel/config/nvmet/ports/1
	mkdir -p \$P
	echo tcp > \$P/addr_trtype; echo ipv4 > \$P/addr_adrfam
	echo 127.0.0.1 > \$P/addr_traddr; echo 4421 > \$P/addr_trsvcid
	ln -s \$S \$P/subsystems/
	dev=\$(attach 4421 nqn.2014-08.org.bench:kernel)
	fio_on nvmet \$dev randread
	fio_on nvmet \$dev randwrite
	detach
	rm \$P/subsystems/nqn.2014-08.org.bench:kernel
	rmdir \$P
	echo 0 > \$S/namespaces/1/enable
	rmdir \$S/namespaces/1 \$S
	kill -TERM \$srv; wait \$srv || die "nvraid serve --ublk failed"
	rep=\$((rep + 1))
done
echo DONE
GUEST
out=$(tools/mdvm/mdvm --kernel 6.12 --modules "ublk_drv brd nvme_tcp nvmet_tcp" --smp 2 --mem 2G \
	--timeout 900 --indir "$work/in" --script "$work/guest.sh" "$work/unused.img" 2>&1 || true)
echo "$out" | grep -E "^(RESULT|DONE|FAIL)|rror" || true
iops() { # NAME RW: the mean IOPS of its runs
	echo "$out" | awk -v n="$1" -v rw="$2" '$1 == "RESULT" && $2 == n && $3 == rw {
		v = $5; sub("IOPS=", "", v); m = 1
		if (v ~ /k$/) { m = 1000; sub("k$", "", v) }
		s += v * m; c++ } END { if (c) printf "%.0f", s / c; else print 0 }'
}
for rw in randread randwrite; do
	a=$(iops nvraid $rw); b=$(iops nvmet $rw)
	awk -v a="$a" -v b="$b" -v rw="$rw" 'BEGIN { printf "RATIO %s nvraid/nvmet = %d / %d = %.2f\n", rw, a, b, (b ? a / b : 0) }'
done
echo "host: $(nproc) CPUs, $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1), $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
