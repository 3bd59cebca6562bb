# Inside the kernel VM (Linux 6.12 with ublk_drv and ext4; busybox sh):
# ublk-ram, mkfs.ext4 and e2fsck are in $MDVM_IN with the libraries they
# need. Every check prints a line the host test looks for; any failure
# exits non-zero at once.
set -e
export LD_LIBRARY_PATH=$MDVM_IN
SRV=$MDVM_IN/ublk-ram
DISK=/dev/shm/disk
WAIT_TENTHS=300
. $MDVM_IN/vmlib.sh

[ -c /dev/ublk-control ] || fail "no /dev/ublk-control"

# 1. A device appears; raw data through it, with O_DIRECT.
t0=$(ms)
$SRV --file $DISK --size 96M --queues 2 --recovery 2> /tmp/srv1.log &
SRV1=$!
wait_for -b /dev/ublkb0
t1=$(ms)
echo "DEVICE /dev/ublkb0 after $((t1 - t0)) ms: $(cat /tmp/srv1.log)"
echo "LIMITS lbs=$(cat /sys/block/ublkb0/queue/logical_block_size) pbs=$(cat /sys/block/ublkb0/queue/physical_block_size) max_kb=$(cat /sys/block/ublkb0/queue/max_sectors_kb) discard_gran=$(cat /sys/block/ublkb0/queue/discard_granularity) cache=$(cat /sys/block/ublkb0/queue/write_cache)"
pattern cat -s 7 33554432 > /tmp/raw
t0=$(ms)
dd if=/tmp/raw of=/dev/ublkb0 bs=1M oflag=direct 2> /dev/null
t1=$(ms)
dd if=/dev/ublkb0 of=/tmp/back bs=1M count=32 iflag=direct 2> /dev/null
t2=$(ms)
cmp /tmp/raw /tmp/back || fail "raw data read back differs"
rm /tmp/back
echo "RAW 32 MiB ok: write $((t1 - t0)) ms, read $((t2 - t1)) ms"

# 2. Discard: the server punches the range out of its file, which then reads zeros.
before=$(du -k $DISK | cut -f1)
blkdiscard -o 8388608 -l 16777216 /dev/ublkb0
after=$(du -k $DISK | cut -f1)
[ $((before - after)) -ge 16384 ] || fail "discard freed $((before - after)) KiB of the file, not 16384"
dd if=/dev/ublkb0 of=/tmp/back bs=1M skip=8 count=16 iflag=direct 2> /dev/null
dd if=/dev/zero of=/tmp/zero bs=1M count=16 2> /dev/null
cmp /tmp/back /tmp/zero || fail "a discarded range does not read zeros"
rm /tmp/back /tmp/zero
echo "DISCARD ok: file $before KiB -> $after KiB"

# 3. A filesystem: files written and synced (FLUSH), read back.
$MDVM_IN/mkfs.ext4 -q -F -E nodiscard /dev/ublkb0 || fail "mkfs.ext4"
mkdir -p /mnt
mount -t ext4 /dev/ublkb0 /mnt || fail "mount"
write_files /mnt 20
sync
echo "FILES 20 written and synced"

# 4. kill -9 with user recovery: the device stays, I/O waits, a second
# server re-attaches, the files verify and the waiting write completes.
kill -9 $SRV1
wait $SRV1 || true
sleep 0.5
[ -b /dev/ublkb0 ] || fail "the device went away with its server despite recovery"
echo "KILLED server 1: /dev/ublkb0 stays"
(pattern cat -s 99 1048576 > /mnt/late && sync && echo done > /tmp/late.done) &
LATE=$!
sleep 0.5
[ ! -e /tmp/late.done ] || fail "a write completed with no server"
t0=$(ms)
$SRV --recover 0 --file $DISK 2> /tmp/srv2.log &
SRV2=$!
wait_log /tmp/srv2.log re-attached
t1=$(ms)
echo "RECOVERED after $((t1 - t0)) ms: $(cat /tmp/srv2.log)"
wait $LATE || fail "the write issued while no server ran failed"
# Read from the device (through server 2), not from the page cache.
sync
echo 3 > /proc/sys/vm/drop_caches
i=1
while [ $i -le 20 ]; do
	pattern verify -s $i -n 1048576 /mnt/f$i > /dev/null || fail "f$i differs after recovery"
	i=$((i + 1))
done
pattern verify -s 99 -n 1048576 /mnt/late > /dev/null || fail "late differs"
echo "VERIFIED 21 files after recovery"

# 5. Discard from the filesystem, then a clean unmount and fsck.
rm /mnt/f1 /mnt/f2 /mnt/f3 /mnt/f4 /mnt/f5 /mnt/f6 /mnt/f7 /mnt/f8
sync
fstrim /mnt || fail "fstrim"
umount /mnt
echo 3 > /proc/sys/vm/drop_caches
$MDVM_IN/e2fsck -fn /dev/ublkb0 > /tmp/fsck.log 2>&1 || { cat /tmp/fsck.log; fail "e2fsck"; }
echo "FSCK clean"

# 6. SIGTERM: the server stops and deletes the device, and says what it served.
kill -TERM $SRV2
wait $SRV2 || fail "server 2 exited $?"
cat /tmp/srv2.log
[ ! -e /dev/ublkb0 ] || fail "/dev/ublkb0 still there after SIGTERM"
[ ! -e /dev/ublkc0 ] || fail "/dev/ublkc0 still there after SIGTERM"
echo "STOPPED: device removed"

# 7. kill -9 without recovery under a writer that writes, syncs and
# verifies the device over and over: the writer gets an error, the block
# device goes away, nothing hangs (no process in D state); the dead
# device keeps its id until deleted.
$SRV --file $DISK 2> /tmp/srv3.log &
SRV3=$!
wait_for -b /dev/ublkb0
dd if=/dev/ublkb0 of=/dev/null bs=1M count=4 iflag=direct 2> /dev/null || fail "read from server 3"
(
	s=1
	while pattern write -s $s -n 8388608 /dev/ublkb0 > /dev/null 2>> /tmp/writer.log &&
		pattern verify -s $s -n 8388608 /dev/ublkb0 > /dev/null 2>> /tmp/writer.log; do
		echo $s >> /tmp/rounds
		s=$((s + 1))
	done
	exit 1
) &
WRITER=$!
wait_for -s /tmp/rounds
kill -9 $SRV3
wait $SRV3 || true
n=0
while [ -b /dev/ublkb0 ]; do
	n=$((n + 1)); [ $n -lt 100 ] || fail "/dev/ublkb0 stayed after its server was killed without recovery"
	sleep 0.1
done
echo "GONE without recovery after ~$((n * 100)) ms"
n=0
while kill -0 $WRITER 2> /dev/null; do
	n=$((n + 1)); [ $n -lt 300 ] || fail "the writer hung after its device went away"
	sleep 0.1
done
wait $WRITER || true
stuck=$(for s in /proc/[0-9]*/status; do grep -q '^State:.*D' $s 2> /dev/null && sed -n 's/^Name:\s*//p' $s; done | tr '\n' ' ')
[ -z "$stuck" ] || fail "processes in D state after the kill: $stuck"
echo "WRITER ended after $(wc -l < /tmp/rounds) verified rounds: $(tail -1 /tmp/writer.log); none in D state"
[ -e /dev/ublkc0 ] || fail "the dead device's /dev/ublkc0 went too"
$SRV --delete 0 2> /tmp/srv4.log || fail "--delete 0"
[ ! -e /dev/ublkc0 ] || fail "/dev/ublkc0 still there after --delete"
echo "DELETED the dead device"
