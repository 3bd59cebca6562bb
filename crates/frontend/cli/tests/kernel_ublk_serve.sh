# Inside the kernel VM (Linux 6.12 with ublk_drv and ext4; busybox sh):
# nvraid, mkfs.ext4 and e2fsck are in $MDVM_IN with the libraries they
# need; the disks are a RAID 5 of 3 (64 KiB chunks) and a RAID 0 of 3
# (64 KiB chunks) that nvraid created on the host. Every check prints a
# line the host test looks for; any failure exits non-zero at once.
set -e
export LD_LIBRARY_PATH=$MDVM_IN
N=$MDVM_IN/nvraid
set -- $MDVM_DISKS
R5="$1 $2 $3"
R0="$4 $5 $6"
. $MDVM_IN/vmlib.sh
q() { cat /sys/block/ublkb0/queue/$1; }
limits() {
	echo "LIMITS $1 size=$(($(cat /sys/block/ublkb0/size) * 512)) lbs=$(q logical_block_size) pbs=$(q physical_block_size) min=$(q minimum_io_size) opt=$(q optimal_io_size) max_kb=$(q max_sectors_kb) discard_gran=$(q discard_granularity) cache=$(q write_cache) fua=$(q fua) ro=$(cat /sys/block/ublkb0/ro)"
}

# writer FIRST: files wFIRST, wFIRST+1, ... on /mnt, each synced before its
# number goes to /tmp/synced, until /tmp/stop; returns once one is synced
# ($WRITER is its pid).
writer() {
	rm -f /tmp/stop /tmp/synced
	(
		i=$1
		while [ ! -e /tmp/stop ]; do
			pattern cat -s $i 262144 > /mnt/w$i
			sync
			echo $i >> /tmp/synced
			i=$((i + 1))
		done
	) &
	WRITER=$!
	wait_for -s /tmp/synced
}

# writer_goes_on BEFORE WHAT: the writer syncs files past BEFORE after
# WHAT, then stops without an error; the page cache is dropped.
writer_goes_on() {
	n=0
	while [ $(wc -l < /tmp/synced) -le $(($1 + 2)) ]; do
		n=$((n + 1)); [ $n -lt 600 ] || fail "the writer did not continue after the $2"
		sleep 0.1
	done
	touch /tmp/stop
	wait $WRITER || fail "the writer failed across the $2"
	sync
	echo 3 > /proc/sys/vm/drop_caches
}

[ -c /dev/ublk-control ] || fail "no /dev/ublk-control"

# 1. The RAID 5 becomes /dev/ublkb0, with the array's size and geometry.
t0=$(ms)
$N serve --ublk 0 --ublk-record /run/nvraid/ublk/data --control /tmp/ctl $R5 2> /tmp/srv1.log &
SRV1=$!
wait_for -b /dev/ublkb0
t1=$(ms)
wait_log /tmp/srv1.log ublk-added
echo "DEVICE /dev/ublkb0 after $((t1 - t0)) ms"
# --ublk-record: the device's number, for nvraid run and `nvraid ublk name`.
[ "$(cat /run/nvraid/ublk/data)" = 0 ] || fail "--ublk-record holds '$(cat /run/nvraid/ublk/data)', not 0"
[ "$(NVRAID_RUN_DIR=/run/nvraid $N ublk name ublkb0)" = data ] || fail "nvraid ublk name ublkb0"
echo "RECORD /run/nvraid/ublk/data holds 0, ublk name ublkb0: data"
limits raid5
echo "ARRAY size=$($N detail --json $R5 | sed -n 's/.*"size_bytes": *\([0-9]*\).*/\1/p' | head -1)"
$N status --socket /tmp/ctl > /tmp/status || fail "nvraid status"
echo "STATUS $(grep '^ublk:' /tmp/status)"

# 2. Raw data with O_DIRECT, at offsets that cross stripes, read back.
pattern cat -s 7 33554432 > /tmp/raw
dd if=/tmp/raw of=/dev/ublkb0 bs=192k seek=3 oflag=direct 2> /dev/null
echo 3 > /proc/sys/vm/drop_caches
dd if=/dev/ublkb0 of=/tmp/back bs=192k skip=3 count=$((33554432 / 196608 + 1)) iflag=direct 2> /dev/null
head -c 33554432 /tmp/back | cmp - /tmp/raw || fail "raw data read back differs"
rm /tmp/back /tmp/raw
echo "RAW 32 MiB ok"

# 3. ext4 (mkfs discards the device first), files, sync.
$MDVM_IN/mkfs.ext4 -q -F /dev/ublkb0 || fail "mkfs.ext4"
mkdir -p /mnt
mount -t ext4 /dev/ublkb0 /mnt || fail "mount"
write_files /mnt 20
sync
echo "FILES 20 written and synced"

# 4. kill -9 of nvraid while a writer runs: the device and the mount stay;
# a new nvraid serve --ublk 0 takes the device over; every synced file verifies.
writer 100
sleep 1
kill -9 $SRV1
wait $SRV1 || true
before=$(wc -l < /tmp/synced)
sleep 1
[ -b /dev/ublkb0 ] || fail "the device went away with its server"
[ "$(cat /run/nvraid/ublk/data)" = 0 ] || fail "the record went away with a killed server"
grep -q "^/dev/ublkb0 /mnt " /proc/mounts || fail "the filesystem was unmounted"
echo "KILLED nvraid under a writer ($before files synced): /dev/ublkb0 stays, /mnt mounted"
t0=$(ms)
$N serve --ublk 0 --ublk-record /run/nvraid/ublk/data --control /tmp/ctl $R5 2> /tmp/srv2.log &
SRV2=$!
wait_log /tmp/srv2.log ublk-reattached
t1=$(ms)
echo "REATTACHED after $((t1 - t0)) ms: $(grep ublk-reattached /tmp/srv2.log)"
writer_goes_on $before take-over
i=1
while [ $i -le 20 ]; do
	pattern verify -s $i -n 1048576 /mnt/f$i > /dev/null || fail "f$i differs after the take-over"
	i=$((i + 1))
done
count=0
for i in $(cat /tmp/synced); do
	pattern verify -s $i -n 262144 /mnt/w$i > /dev/null || fail "w$i differs after the take-over"
	count=$((count + 1))
done
echo "VERIFIED 20 files and $count writer files after the take-over"
$N status --socket /tmp/ctl > /tmp/status || fail "nvraid status after the take-over"
echo "STATUS2 $(grep '^ublk:' /tmp/status)"

# 5. A second server asking for the same device is refused by name, and
# the array's members are not touched.
if $N serve --ublk 0 $R0 2> /tmp/srv-refused.log; then fail "a second server took a live device"; fi
echo "REFUSED $(cat /tmp/srv-refused.log)"

# 6. A restart under the mounted filesystem (once the resync of the killed
# server's dirty array is done): SIGTERM while a writer runs leaves the
# device to the next server (--ublk-stop auto: in use), the server exits
# 0 with the array clean; a new server takes the device over, the writer
# goes on, every file it synced verifies.
wait_log /tmp/srv2.log "resync done"
writer 300
kill -TERM $SRV2
wait $SRV2 || fail "nvraid serve exited $? on SIGTERM under a mounted filesystem"
grep -q "ublk-left-for-next-server" /tmp/srv2.log || { cat /tmp/srv2.log; fail "no ublk-left-for-next-server in the log"; }
[ -b /dev/ublkb0 ] || fail "the device went away with a restart under a mounted filesystem"
grep -q "^/dev/ublkb0 /mnt " /proc/mounts || fail "the filesystem was unmounted by the restart"
[ "$(cat /run/nvraid/ublk/data)" = 0 ] || fail "the record went away with the device left for the next server"
kill -0 $WRITER 2> /dev/null || fail "the writer stopped during the restart"
echo "HANDOVER $($N detail $R5 | grep 'State :')"
$N serve --ublk 0 --ublk-record /run/nvraid/ublk/data --control /tmp/ctl $R5 2> /tmp/srv5.log &
SRV2=$!
wait_log /tmp/srv5.log ublk-reattached
before=$(wc -l < /tmp/synced)
writer_goes_on $before restart
count=0
for i in $(cat /tmp/synced); do
	pattern verify -s $i -n 262144 /mnt/w$i > /dev/null || fail "w$i differs after the restart"
	count=$((count + 1))
done
echo "RESTARTED under the mounted filesystem: $count writer files verify"

# 7. Clean unmount, fsck, SIGTERM (nothing holds the device now): the
# device is deleted, the array clean.
umount /mnt
echo 3 > /proc/sys/vm/drop_caches
$MDVM_IN/e2fsck -fn /dev/ublkb0 > /tmp/fsck.log 2>&1 || { cat /tmp/fsck.log; fail "e2fsck"; }
echo "FSCK clean"
kill -TERM $SRV2
wait $SRV2 || fail "nvraid serve exited $?"
[ ! -e /dev/ublkb0 ] || fail "/dev/ublkb0 still there after SIGTERM"
[ ! -e /dev/ublkc0 ] || fail "/dev/ublkc0 still there after SIGTERM"
grep -q "ublk-deleted" /tmp/srv5.log || fail "no ublk-deleted in the log"
[ ! -e /run/nvraid/ublk/data ] || fail "--ublk-record's file stays after the device was deleted"
echo "RECORD removed with the device"
echo "STOPPED: device removed; $(tail -1 /tmp/srv5.log)"
echo "DETAIL raid5 $($N detail $R5 | grep 'State :')"

# 8. RAID 0 of 3 (a 192 KiB stripe: no power of two, so no io_opt), --ublk
# auto, behind --cache writeback (the device's writes land in the cache,
# SIGTERM writes them back to the members).
$N serve --ublk auto --cache writeback $R0 2> /tmp/srv3.log &
SRV3=$!
wait_log /tmp/srv3.log ublk-added
dev=$(sed -n 's/.*device=\(\/dev\/ublkb[0-9]*\).*/\1/p' /tmp/srv3.log | head -1)
[ "$dev" = /dev/ublkb0 ] || fail "auto gave $dev, not the free /dev/ublkb0"
wait_for -b /dev/ublkb0
limits raid0
pattern cat -s 11 16777216 > /tmp/raw
dd if=/tmp/raw of=/dev/ublkb0 bs=1M oflag=direct 2> /dev/null
dd if=/dev/ublkb0 of=/tmp/back bs=1M count=16 iflag=direct 2> /dev/null
cmp /tmp/back /tmp/raw || fail "raid0 data read back differs"
echo "RAID0 16 MiB ok"
kill -TERM $SRV3
wait $SRV3 || fail "raid0 nvraid serve exited $?"
[ ! -e /dev/ublkb0 ] || fail "/dev/ublkb0 still there after SIGTERM (raid0)"
$N read --length 16777216 $R0 > /tmp/back 2> /dev/null || fail "nvraid read raid0"
cmp /tmp/back /tmp/raw || fail "the cached writes are not on the raid0 members after SIGTERM"
echo "WRITTEN BACK 16 MiB through --cache writeback"
# 9. The RAID 0 read-only as device 4, then its server killed for good
# (its array not served again): `nvraid ublk
# list` shows its device with no server while a reader waits on it;
# `nvraid ublk delete` (refused while a server runs the device) frees the
# number and the waiting read fails; nothing hangs.
$N serve --ublk 4 --read-only $R0 2> /tmp/srv4.log &
SRV4=$!
wait_log /tmp/srv4.log ublk-added
wait_for -b /dev/ublkb4
# --read-only: the kernel sees a read-only disk and refuses writes.
if dd if=/tmp/raw of=/dev/ublkb4 bs=4096 count=1 oflag=direct 2> /tmp/ro.log; then
	fail "a write to the read-only /dev/ublkb4 succeeded"
fi
cmp -n 65536 /dev/ublkb4 /tmp/raw || fail "read-only /dev/ublkb4 does not read the raid0 data"
echo "READ-ONLY ro=$(cat /sys/block/ublkb4/ro): $(tail -1 /tmp/ro.log)"
if $N ublk delete 4 > /tmp/del-live.log 2>&1; then fail "ublk delete took a running server's device"; fi
echo "DELETE-LIVE $(cat /tmp/del-live.log)"
kill -9 $SRV4
wait $SRV4 2> /dev/null || true
dd if=/dev/ublkb4 of=/dev/null bs=4096 count=1 skip=1000 iflag=direct 2> /tmp/reader.log &
READER=$!
sleep 1
echo "LIST $($N ublk list | grep ublkb4)"
$N ublk delete 4 || fail "nvraid ublk delete 4"
wait_for ! -e /dev/ublkc4
if wait $READER; then fail "a read of the deleted device succeeded"; fi
echo "RELEASED /dev/ublkb4: the waiting read failed ($(tail -1 /tmp/reader.log))"
# 10. --ublk-recovery off: kill -9 of the server under a reader; the
# device fails the reader's I/O and goes away, nothing hangs; its number
# stays taken (a new server is refused, naming `nvraid ublk delete`)
# until deleted.
$N serve --ublk 5 --read-only --ublk-recovery off $R0 2> /tmp/srv6.log &
SRV6=$!
wait_log /tmp/srv6.log ublk-added
wait_for -b /dev/ublkb5
(
	while dd if=/dev/ublkb5 of=/dev/null bs=64k count=64 iflag=direct 2> /tmp/reader6.log; do
		echo x >> /tmp/reads6
	done
) &
READER=$!
wait_for -s /tmp/reads6
kill -9 $SRV6
wait $SRV6 2> /dev/null || true
n=0
while kill -0 $READER 2> /dev/null; do
	n=$((n + 1)); [ $n -lt 300 ] || fail "the reader still runs 30 s after its server died (recovery off)"
	sleep 0.1
done
wait_for ! -b /dev/ublkb5
[ -z "$(stuck)" ] || fail "processes in D state: $(stuck)"
if $N serve --ublk 5 --read-only $R0 2> /tmp/srv7.log; then fail "a server took a dead device without recovery"; fi
echo "NO-RECOVERY reader stopped ($(tail -1 /tmp/reader6.log)), /dev/ublkb5 gone, nothing in D state; again: $(tail -1 /tmp/srv7.log)"
$N ublk delete 5 || fail "nvraid ublk delete 5"
wait_for ! -e /dev/ublkc5
echo "DETAIL raid0 $($N detail $R0 | grep 'State :')"
echo "DONE"
