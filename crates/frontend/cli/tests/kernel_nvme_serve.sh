# Inside the kernel VM (Linux 6.12 with nvme_tcp and ext4; busybox sh):
# nvraid, mkfs.ext4 and e2fsck are in $MDVM_IN with the libraries they
# need; the first three disks are a RAID 5 of 3 (64 KiB chunks) nvraid
# created on the host, the fourth a blank disk the array grows onto. The kernel's own NVMe/TCP initiator attaches to `nvraid serve
# --nvme-tcp` through /dev/nvme-fabrics (no nvme-cli). Every check prints a
# line the host test looks for; any failure exits non-zero at once.
set -e
export LD_LIBRARY_PATH=$MDVM_IN
N=$MDVM_IN/nvraid
. $MDVM_IN/vmlib.sh
VM_DMESG=1
HOSTNQN=nqn.2014-08.org.nvraid:vm-host
# The kernel ties a host id to each host NQN: each NQN brings its own.
HOST="hostnqn=$HOSTNQN,hostid=5e1f0c7a-1111-4111-8111-000000000001"

# The initiator and the target meet on the loopback interface.
ip link set lo up 2> /dev/null || ifconfig lo 127.0.0.1 up
[ -c /dev/nvme-fabrics ] || fail "no /dev/nvme-fabrics (nvme_tcp not loaded?)"

# try_connect OPTIONS: attach through the kernel's fabrics device; prints
# what it answered (instance=N,cntlid=M); fails when the kernel did not
# connect.
try_connect() {
	exec 3<> /dev/nvme-fabrics
	if ! echo "$1" >&3; then
		exec 3>&-
		return 1
	fi
	read -r answer <&3 || true
	exec 3>&-
	echo "$answer"
}
# connect OPTIONS: as try_connect, and a failure ends the script (it runs
# in $(...): the reason goes to stderr).
connect() {
	if ! try_connect "$1"; then
		{ echo "FAIL: the kernel could not connect: $1"; cat /tmp/srv1.log; dmesg | tail -20; } >&2
		exit 1
	fi
}

# gone: the server has seen one more admin queue end than before.
admin_ends() { grep -c 'event=nvme-disconnected queue=0' /tmp/srv1.log || true; }
wait_admin_end() {
	n=0
	while [ "$(admin_ends)" -le "$1" ]; do
		n=$((n + 1)); [ $n -lt 600 ] || fail "the server did not see the controller go"
		sleep 0.1
	done
}

# namespace: the block device of the subsystem's namespace, once it shows.
namespace() {
	n=0
	while :; do
		for b in /sys/block/nvme*n1; do
			# nvmeXcYnZ: a path of a multipath namespace, not a device.
			case ${b##*/} in *c*) continue ;; esac
			[ -e "$b" ] && { echo /dev/${b##*/}; return; }
		done
		n=$((n + 1)); [ $n -lt 600 ] || fail "no namespace block device appeared"
		sleep 0.1
	done
}

set -- $MDVM_DISKS
MEMBERS="$1 $2 $3"
NEW=$4

# 1. The server: the RAID 5 as an NVMe/TCP subsystem, only this host.
$N serve --nvme-tcp 127.0.0.1:4420 --nvme-host $HOSTNQN --control /tmp/ctl $MEMBERS 2> /tmp/srv1.log &
SRV=$!
wait_log /tmp/srv1.log listening-nvme-tcp
NQN=$(sed -n 's/.*event=listening-nvme-tcp address=[^ ]* nqn=//p' /tmp/srv1.log)
echo "NQN $NQN"

# 2. The discovery controller: the kernel connects, identifies it, leaves.
disc=$(connect "transport=tcp,traddr=127.0.0.1,trsvcid=4420,nqn=nqn.2014-08.org.nvmexpress.discovery,$HOST")
inst=${disc#instance=}; inst=${inst%%,*}
echo "DISCOVERY $disc type=$(cat /sys/class/nvme/nvme$inst/cntrltype 2>/dev/null || echo ?)"
echo 1 > /sys/class/nvme/nvme$inst/delete_controller

# 3. A host not in --nvme-host is refused at Connect.
if try_connect "transport=tcp,traddr=127.0.0.1,trsvcid=4420,nqn=$NQN,hostnqn=nqn.2014-08.org.example:stranger,hostid=5e1f0c7a-2222-4222-8222-000000000002" > /dev/null 2>&1; then
	fail "a host not in --nvme-host was let in"
fi
wait_log /tmp/srv1.log "is not in --nvme-host"
echo "STRANGER refused"

# 4. The I/O controller: the namespace is the array.
ctrl=$(connect "transport=tcp,traddr=127.0.0.1,trsvcid=4420,nqn=$NQN,$HOST")
inst=${ctrl#instance=}; inst=${inst%%,*}
DEV=$(namespace)
b=${DEV#/dev/}
echo "ATTACHED $DEV size=$(($(cat /sys/block/$b/size) * 512)) lbs=$(cat /sys/block/$b/queue/logical_block_size) max_kb=$(cat /sys/block/$b/queue/max_hw_sectors_kb) cache=$(cat /sys/block/$b/queue/write_cache) subsysnqn=$(cat /sys/class/nvme/nvme$inst/subsysnqn)"
echo "STATUS $($N status --socket /tmp/ctl | grep -A3 '^nvme-tcp' | tr '\n' ' ')"

# 5. Raw data across stripes, read back after the page cache is dropped.
pattern write -n 33554432 $DEV
sync
echo 3 > /proc/sys/vm/drop_caches
pattern verify -n 33554432 $DEV || fail "the raw data read back differently"
echo "RAW 32 MiB ok"

# 6. A discard (Dataset Management, 4 KiB of data for one range), then
# ext4 (mkfs discards too), 20 files, synced.
blkdiscard -o 1048576 -l 1048576 $DEV || fail "blkdiscard"
echo "DISCARDED 1 MiB"

$MDVM_IN/mkfs.ext4 -q -F $DEV > /tmp/mkfs.log 2>&1 || { cat /tmp/mkfs.log; fail "mkfs.ext4"; }
mkdir -p /mnt
mount -t ext4 $DEV /mnt
write_files /mnt 20
sync
umount /mnt
echo "FILES 20 written"

# 7. Disconnect; the server lets the controller go.
ends=$(admin_ends)
echo 1 > /sys/class/nvme/nvme$inst/delete_controller
wait_admin_end $ends
[ ! -e $DEV ] || fail "$DEV is still there after the disconnect"
echo "DISCONNECTED"

# 8. Connect again: the files are there, the filesystem is clean.
ctrl=$(connect "transport=tcp,traddr=127.0.0.1,trsvcid=4420,nqn=$NQN,$HOST")
inst=${ctrl#instance=}; inst=${inst%%,*}
DEV=$(namespace)
$MDVM_IN/e2fsck -fn $DEV > /tmp/fsck.log 2>&1 || { cat /tmp/fsck.log; fail "e2fsck"; }
mount -t ext4 $DEV /mnt
i=1
while [ $i -le 20 ]; do
	pattern cat -s $i 1048576 | cmp - /mnt/f$i || fail "file f$i differs after reconnecting"
	i=$((i + 1))
done
umount /mnt
echo "VERIFIED 20 files after reconnecting, fsck clean"

# 8b. The array grows onto the fourth disk while the host stays attached
# with ext4 mounted: at the grow's end the served shape is swapped, the
# namespace takes the new size, and the host hears of it through a
# Namespace Attribute Changed notice (an Asynchronous Event), then rescans.
mount -t ext4 $DEV /mnt
old_bytes=$(($(cat /sys/block/$b/size) * 512))
$N grow --socket /tmp/ctl -n 4 --add $NEW > /tmp/grow.log 2>&1 || { cat /tmp/grow.log; fail "the online grow"; }
echo "GROWN $(tail -n 1 /tmp/grow.log)"
n=0
while [ $(($(cat /sys/block/$b/size) * 512)) -eq $old_bytes ]; do
	n=$((n + 1)); [ $n -lt 300 ] || { dmesg | tail -20; fail "the host never saw the namespace grow"; }
	sleep 0.1
done
new_bytes=$(($(cat /sys/block/$b/size) * 512))
grep -q "event=nvme-namespace-resized old_bytes=$old_bytes new_bytes=$new_bytes" /tmp/srv1.log || fail "the server logged no resize to $new_bytes"
echo "RESIZED old=$old_bytes new=$new_bytes"
# The region past the old end, raw (ext4 does not reach it yet): 8 MiB
# written by the host and read back past its page cache.
pattern cat -s 7 8388608 > /tmp/tail.ref
dd if=/tmp/tail.ref of=$DEV bs=1048576 seek=$((old_bytes / 1048576)) conv=fsync 2> /dev/null || fail "writing past the old end"
echo 3 > /proc/sys/vm/drop_caches
dd if=$DEV of=/tmp/tail.got bs=1048576 skip=$((old_bytes / 1048576)) count=8 iflag=direct 2> /dev/null || fail "reading past the old end"
cmp /tmp/tail.ref /tmp/tail.got || fail "the grown region read back differently"
# ext4 grown online into it, filled further, and checked.
$MDVM_IN/resize2fs $DEV > /tmp/resize.log 2>&1 || { cat /tmp/resize.log; fail "resize2fs"; }
write_files_from() {
	i=$1
	while [ $i -le $2 ]; do
		pattern cat -s $i 1048576 > /mnt/f$i
		i=$((i + 1))
	done
}
write_files_from 21 40
sync
umount /mnt
echo 3 > /proc/sys/vm/drop_caches
$MDVM_IN/e2fsck -fn $DEV > /tmp/fsck.log 2>&1 || { cat /tmp/fsck.log; fail "e2fsck after the grow"; }
mount -t ext4 $DEV /mnt
i=1
while [ $i -le 40 ]; do
	pattern cat -s $i 1048576 | cmp - /mnt/f$i || fail "file f$i differs after the grow"
	i=$((i + 1))
done
umount /mnt
echo "GREW ext4 online: 40 files verified, fsck clean, $(($(cat /sys/block/$b/size) * 512)) bytes"
echo 1 > /sys/class/nvme/nvme$inst/delete_controller

# 9. SIGTERM: the server stops, the array is flushed and closed clean.
kill -TERM $SRV
wait $SRV || fail "the server failed to stop"
echo "STOPPED: $(tail -n 1 /tmp/srv1.log)"
echo "DETAIL $($N detail $MDVM_DISKS | grep -e 'State :' -e 'Raid Devices :' | tr -s ' ' | tr '\n' ' ')"
echo DONE
