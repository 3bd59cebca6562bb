# Inside the kernel VM (Linux 6.12 with ublk_drv and xfs; busybox sh):
# nvraid, mkfs.xfs and xfs_repair are in $MDVM_IN with their libraries.
# The disks, in order, are the arrays nvraid created on the host (see
# kernel_ublk_xfs.rs): RAID 0 of 2, RAID 1 of 2, RAID 10 of 4, RAID 5 of
# 3, RAID 6 of 6, RAID 5 of 4. Each array in turn: served as /dev/ublkb0,
# mkfs.xfs (su/sw from the device, or given where the device cannot say
# them), files written and synced, verified after a remount, umount,
# xfs_repair -n, SIGTERM; then the kernel's md assembles the same members
# read-only and the files verify through it. Every step prints a line the
# host test checks; any failure exits non-zero at once.
set -e
export LD_LIBRARY_PATH=$MDVM_IN
N=$MDVM_IN/nvraid
. $MDVM_IN/vmlib.sh
q() { cat /sys/block/ublkb0/queue/$1; }
mkdir -p /mnt

# level NAME "MKFS OPTIONS" MEMBERS...
level() {
	name=$1 opts=$2
	shift 2
	members="$*"
	t0=$(ms)
	$N serve --ublk 0 $members 2> /tmp/srv-$name.log &
	srv=$!
	wait_log /tmp/srv-$name.log ublk-added
	wait_for -b /dev/ublkb0
	echo "HINTS $name min=$(q minimum_io_size) opt=$(q optimal_io_size)"
	$MDVM_IN/mkfs.xfs -f $opts /dev/ublkb0 > /tmp/mkfs.log 2>&1 || { cat /tmp/mkfs.log; fail "mkfs.xfs $name"; }
	echo "MKFS $name $(sed -n 's/.*\(sunit=[0-9]* *swidth=[0-9]* blks\).*/\1/p' /tmp/mkfs.log | head -1 | tr -s ' ')"
	mount -t xfs /dev/ublkb0 /mnt || fail "mount $name"
	i=1
	while [ $i -le 6 ]; do
		pattern cat -s $i $((i * 262144)) > /mnt/f$i
		i=$((i + 1))
	done
	mkdir /mnt/d
	pattern cat -s 99 4194304 > /mnt/d/big
	sync
	umount /mnt
	echo 3 > /proc/sys/vm/drop_caches
	mount -t xfs /dev/ublkb0 /mnt || fail "remount $name"
	verify_files "through ublk"
	umount /mnt
	$MDVM_IN/xfs_repair -n /dev/ublkb0 > /tmp/repair.log 2>&1 || { cat /tmp/repair.log; fail "xfs_repair -n $name"; }
	echo "REPAIR $name clean"
	kill -TERM $srv
	wait $srv || fail "nvraid serve ($name) exited $?"
	[ ! -e /dev/ublkb0 ] || fail "/dev/ublkb0 still there after SIGTERM ($name)"
	# The kernel's md reads the same filesystem from the same members.
	mdadm --assemble --readonly /dev/md0 $members > /tmp/md.log 2>&1 || { cat /tmp/md.log; fail "mdadm --assemble $name"; }
	echo "MD $name $(mdadm --detail /dev/md0 | grep -E 'Raid Level|State :' | tr -s ' ' | tr '\n' ' ')"
	mount -t xfs -o ro,norecovery /dev/md0 /mnt || fail "mount md0 ($name)"
	verify_files "through the kernel's md"
	umount /mnt
	mdadm --stop /dev/md0 > /dev/null 2>&1 || fail "mdadm --stop ($name)"
	echo "LEVEL $name done in $(($(ms) - t0)) ms"
}
verify_files() {
	i=1
	while [ $i -le 6 ]; do
		pattern verify -s $i -n $((i * 262144)) /mnt/f$i > /dev/null || fail "f$i of $name differs $1"
		i=$((i + 1))
	done
	pattern verify -s 99 -n 4194304 /mnt/d/big > /dev/null || fail "big of $name differs $1"
	echo "VERIFIED $name 7 files $1"
}

set -- $MDVM_DISKS
level raid0 "" $1 $2
shift 2
level raid1 "" $1 $2
shift 2
level raid10 "" $1 $2 $3 $4
shift 4
level raid5 "" $1 $2 $3
shift 3
level raid6 "" $1 $2 $3 $4 $5 $6
shift 6
# A 192 KiB stripe (3 data members of 64 KiB): the device cannot say it;
# the user gives it, as docs/ublk.md shows.
level raid5x4 "-d su=64k,sw=3" $1 $2 $3 $4
echo "DONE"
