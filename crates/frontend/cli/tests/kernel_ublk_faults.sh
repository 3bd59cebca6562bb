# Inside the kernel VM (Linux 6.12 with ublk_drv, xfs and dm_mod; busybox
# sh): nvraid, mkfs.xfs, xfs_repair and dmsetup are in $MDVM_IN with their
# libraries. The disks, in order: a RAID 1 of 2, a RAID 5 of 3 and a RAID 0
# of 2 that nvraid created on the host (see kernel_ublk_faults.rs). The
# last member of each is used through device-mapper (/dev/mapper/fN, a
# linear map of the disk) so that the script can make it fail: its table
# is swapped for dm's `error` target while a writer runs on XFS over
# /dev/ublkb0. Every step prints a line the host test checks; any failure
# exits non-zero at once.
set -e
export LD_LIBRARY_PATH=$MDVM_IN DM_DISABLE_UDEV=1
N=$MDVM_IN/nvraid
DM=$MDVM_IN/dmsetup
VM_LOGS="/tmp/srv*.log /tmp/writer*.log"
VM_DMESG=1
. $MDVM_IN/vmlib.sh
synced() { wc -l < /tmp/synced 2> /dev/null || echo 0; }
wait_synced() { # wait_synced COUNT: the writer has synced COUNT files (60 s)
	n=0
	while [ $(synced) -lt $1 ]; do
		kill -0 $WRITER 2> /dev/null || fail "the writer stopped ($(cat /tmp/writer.log))"
		n=$((n + 1)); [ $n -lt 600 ] || fail "the writer did not reach $1 synced files"
		sleep 0.1
	done
}
# The writer: file after file on /mnt, each fsync'ed (dd conv=fsync) before
# its number goes to /tmp/synced; stops at /tmp/stop, or at the first error.
writer() {
	i=1
	while [ ! -e /tmp/stop ]; do
		pattern cat -s $i 262144 | dd of=/mnt/w$i bs=64k conv=fsync 2>> /tmp/writer.log || exit 1
		echo $i >> /tmp/synced
		i=$((i + 1))
	done
}
start_writer() { rm -f /tmp/stop /tmp/synced /tmp/writer.log; : > /tmp/synced; writer & WRITER=$!; }
verify_synced() { # every synced file, from the device (caches dropped after a remount)
	umount /mnt
	echo 3 > /proc/sys/vm/drop_caches
	mount -t xfs /dev/ublkb0 /mnt || fail "remount ($1)"
	count=0
	for i in $(cat /tmp/synced); do
		pattern verify -s $i -n 262144 /mnt/w$i > /dev/null || fail "w$i differs ($1)"
		count=$((count + 1))
	done
	echo "VERIFIED $1: $count synced files"
}
# fail_member NAME: its table becomes dm's error target (every I/O fails).
fail_member() {
	$DM reload $1 --table "0 $(blockdev --getsz /dev/mapper/$1) error" || fail "dmsetup reload $1"
	$DM resume $1 || fail "dmsetup resume $1"
}
kernel_errors() { dmesg | grep 'ublkb0' | grep -ci 'error\|shut' || true; }
serve() { # serve NAME MEMBERS...: /dev/ublkb0 with XFS mounted on /mnt
	name=$1
	shift
	$N serve --ublk 0 --control /tmp/ctl-$name "$@" 2> /tmp/srv-$name.log &
	SRV=$!
	wait_log /tmp/srv-$name.log ublk-added
	wait_for -b /dev/ublkb0
	$MDVM_IN/mkfs.xfs -f -q /dev/ublkb0 || fail "mkfs.xfs $name"
	mount -t xfs /dev/ublkb0 /mnt || fail "mount $name"
	dmesg -c > /dev/null
}

mkdir -p /mnt
set -- $MDVM_DISKS
$DM create f1 --table "0 $(blockdev --getsz $2) linear $2 0" || fail "dmsetup create f1"
$DM create f5 --table "0 $(blockdev --getsz $5) linear $5 0" || fail "dmsetup create f5"
$DM create f0 --table "0 $(blockdev --getsz $7) linear $7 0" || fail "dmsetup create f0"
R1="$1 /dev/mapper/f1"
R5="$3 $4 /dev/mapper/f5"
R0="$6 /dev/mapper/f0"

# survive_failure NAME MEMBER: MEMBER fails under the running writer; the
# writer goes on, the filesystem verifies and is clean, the server stops.
survive_failure() {
	fail_member $2
	at=$(synced)
	wait_synced $((at + 5))
	touch /tmp/stop
	wait $WRITER || fail "the $1 writer failed: $(cat /tmp/writer.log)"
	echo "SURVIVED $1: failed after $at files, $(synced) synced, kernel errors $(kernel_errors)"
	$N status --socket /tmp/ctl-$1 > /tmp/status || fail "nvraid status ($1)"
	echo "STATUS $1 $(grep -i "$2" /tmp/status | tr -s ' ' | tr '\n' ' ')"
	verify_synced $1
	umount /mnt
	$MDVM_IN/xfs_repair -n /dev/ublkb0 > /tmp/repair.log 2>&1 || { cat /tmp/repair.log; fail "xfs_repair -n $1"; }
	echo "REPAIR $1 clean"
	kill -TERM $SRV
	wait $SRV || fail "nvraid serve ($1) exited $?"
}

# 1. RAID 1: a member fails under the writer; nothing reaches the filesystem.
serve raid1 $R1
start_writer
wait_synced 3
survive_failure raid1 f1
echo "STOPPED raid1: $(tail -1 /tmp/srv-raid1.log)"

# 2. RAID 5: kill -9 of the server under the writer (user recovery: the
# device and the mount stay), a new server takes the device over, the
# writer goes on; then a member fails under it, and the writer goes on.
serve raid5 $R5
start_writer
wait_synced 3
kill -9 $SRV
wait $SRV || true
before=$(synced)
sleep 1
[ -b /dev/ublkb0 ] || fail "the device went away with its server"
$N serve --ublk 0 --control /tmp/ctl-raid5 $R5 2> /tmp/srv-raid5b.log &
SRV=$!
wait_log /tmp/srv-raid5b.log ublk-reattached
wait_synced $((before + 3))
echo "REATTACHED raid5: killed after $before files, the writer went on to $(synced)"
survive_failure raid5 f5
echo "STOPPED raid5: $(tail -1 /tmp/srv-raid5b.log)"

# 3. RAID 0: a member fails under the writer: the writer gets EIO, the
# server stays up and answers, nothing hangs, the device goes on SIGTERM.
serve raid0 $R0
start_writer
wait_synced 3
fail_member f0
n=0
while kill -0 $WRITER 2> /dev/null; do
	n=$((n + 1)); [ $n -lt 600 ] || fail "the raid0 writer neither failed nor stopped in 60 s (stuck: $(stuck))"
	sleep 0.1
done
if wait $WRITER; then fail "the raid0 writer saw no error"; fi
echo "WRITER raid0: $(tail -1 /tmp/writer.log)"
kill -0 $SRV 2> /dev/null || fail "nvraid serve (raid0) died"
timeout 30 $N status --socket /tmp/ctl-raid0 > /tmp/status || fail "nvraid status (raid0)"
echo "STATUS raid0 $(grep -i 'f0\|state' /tmp/status | tr -s ' ' | tr '\n' ' ')"
timeout 60 umount /mnt || fail "umount (raid0) failed or hung (stuck: $(stuck))"
echo "UMOUNTED raid0"
kill -TERM $SRV
n=0
while kill -0 $SRV 2> /dev/null; do
	n=$((n + 1)); [ $n -lt 600 ] || fail "nvraid serve (raid0) did not stop on SIGTERM"
	sleep 0.1
done
wait $SRV && rc=0 || rc=$?
[ ! -e /dev/ublkb0 ] || fail "/dev/ublkb0 still there after SIGTERM (raid0)"
echo "STOPPED raid0: exit $rc: $(tail -1 /tmp/srv-raid0.log)"
echo "STUCK [$(stuck)]"
echo "DONE"
