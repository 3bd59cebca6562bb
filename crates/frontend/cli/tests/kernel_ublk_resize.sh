# Inside the kernel VM (busybox sh; Linux 6.12, or trixie-backports' newer
# kernel, with ublk_drv and ext4): nvraid, mkfs.ext4, e2fsck and resize2fs
# are in $MDVM_IN; the first three disks are a RAID 5 of 3 (64 KiB chunks)
# nvraid created on the host, the fourth a blank disk the array grows onto
# while /dev/ublkb0 carries a mounted ext4. Every check prints a line the
# host test looks for; any failure exits non-zero at once.
set -e
export LD_LIBRARY_PATH=$MDVM_IN
N=$MDVM_IN/nvraid
set -- $MDVM_DISKS
R5="$1 $2 $3"
NEW=$4
. $MDVM_IN/vmlib.sh
bytes() { echo $(($(cat /sys/block/ublkb0/size) * 512)); }

[ -c /dev/ublk-control ] || fail "no /dev/ublk-control"
echo "KERNEL $(uname -r)"

# 1. The RAID 5 as /dev/ublkb0, ext4 on it with 20 files, mounted.
$N serve --ublk 0 --control /tmp/ctl $R5 2> /tmp/srv1.log &
SRV=$!
wait_for -b /dev/ublkb0
wait_log /tmp/srv1.log ublk-added
old=$(bytes)
$MDVM_IN/mkfs.ext4 -q -F /dev/ublkb0 > /tmp/mkfs.log 2>&1 || { cat /tmp/mkfs.log; fail "mkfs.ext4"; }
mkdir -p /mnt
mount -t ext4 /dev/ublkb0 /mnt
write_files /mnt 20
sync
echo "MOUNTED $old bytes"

# 2. Grown online onto the fourth disk while mounted.
$N grow --socket /tmp/ctl -n 4 --add $NEW > /tmp/grow.log 2>&1 || { cat /tmp/grow.log; fail "the online grow"; }
echo "GROWN $(tail -n 1 /tmp/grow.log)"

if grep -q event=ublk-size-kept /tmp/srv1.log || { sleep 2; grep -q event=ublk-size-kept /tmp/srv1.log; }; then
	# A driver without UPDATE_SIZE: the device keeps its size; a server
	# started again under the mounted filesystem takes the device over
	# at that size (the array is larger, never smaller), and the files
	# are there.
	[ "$(bytes)" = "$old" ] || fail "the device changed size without UPDATE_SIZE"
	echo "KEPT $(bytes) bytes: $(sed -n 's/.*event=ublk-size-kept \([^ ]*\) .*/\1/p' /tmp/srv1.log)"
	kill -9 $SRV
	wait $SRV 2> /dev/null || true
	$N serve --ublk 0 --control /tmp/ctl2 $R5 $NEW 2> /tmp/srv2.log &
	SRV=$!
	wait_log /tmp/srv2.log ublk-reattached
	echo "REATTACHED $(bytes) bytes under the mounted filesystem"
	# The killed server left the array dirty: the new one resyncs it
	# (and closes it clean only once that is done).
	n=0
	until $N status --socket /tmp/ctl2 --json | grep -q '"finished": true'; do
		n=$((n + 1)); [ $n -lt 600 ] || fail "the resync after the kill did not finish"
		sleep 0.5
	done
	echo "RESYNCED after the kill"
else
	# 3. UPDATE_SIZE: the device takes the array's new size by itself.
	n=0
	while [ "$(bytes)" = "$old" ]; do
		n=$((n + 1)); [ $n -lt 300 ] || { cat /tmp/srv1.log; fail "the device never grew"; }
		sleep 0.1
	done
	new=$(bytes)
	grep -q "event=ublk-resized device=/dev/ublkb0 old_bytes=$old new_bytes=$new" /tmp/srv1.log ||
		{ cat /tmp/srv1.log; fail "the server logged no resize to $new"; }
	echo "RESIZED old=$old new=$new"
	# 8 MiB past the old end, raw (ext4 does not reach it yet), read back
	# past the page cache.
	pattern cat -s 7 8388608 > /tmp/tail.ref
	dd if=/tmp/tail.ref of=/dev/ublkb0 bs=1048576 seek=$((old / 1048576)) oflag=direct 2> /dev/null ||
		fail "writing past the old end"
	dd if=/dev/ublkb0 of=/tmp/tail.got bs=1048576 skip=$((old / 1048576)) count=8 iflag=direct 2> /dev/null ||
		fail "reading past the old end"
	cmp /tmp/tail.ref /tmp/tail.got || fail "the grown region read back differently"
	echo "TAIL 8 MiB past the old end ok"
	# ext4 grown online into it.
	$MDVM_IN/resize2fs /dev/ublkb0 > /tmp/resize.log 2>&1 || { cat /tmp/resize.log; fail "resize2fs"; }
	echo "EXT4 grown to $(df -k /mnt | awk 'NR == 2 {print $2}') KiB"
fi

# 4. More files, then everything checked; SIGTERM closes it clean.
i=21
while [ $i -le 40 ]; do
	pattern cat -s $i 1048576 > /mnt/f$i
	i=$((i + 1))
done
sync
umount /mnt
echo 3 > /proc/sys/vm/drop_caches
$MDVM_IN/e2fsck -fn /dev/ublkb0 > /tmp/fsck.log 2>&1 || { cat /tmp/fsck.log; fail "e2fsck"; }
mount -t ext4 /dev/ublkb0 /mnt
i=1
while [ $i -le 40 ]; do
	pattern cat -s $i 1048576 | cmp - /mnt/f$i || fail "file f$i differs"
	i=$((i + 1))
done
umount /mnt
echo "VERIFIED 40 files, fsck clean"
kill -TERM $SRV
wait $SRV || fail "the server failed to stop"
echo "DETAIL $($N detail $MDVM_DISKS | grep -e 'State :' -e 'Raid Devices :' | tr -s ' ' | tr '\n' ' ')"
echo DONE
