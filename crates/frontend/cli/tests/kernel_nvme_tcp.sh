# Inside the kernel VM (Linux 6.12 with nvmet_tcp and null_blk; busybox
# sh): four NVMe/TCP subsystems of the kernel's own target (nvmet),
# configured through configfs on 127.0.0.1:4420, each one namespace on a
# memory-backed null_blk device; nvraid (in $MDVM_IN) makes a RAID 5 of
# them with its own initiator. Every check prints a line the host test
# looks for; any failure exits non-zero at once.
set -e
export LD_LIBRARY_PATH=$MDVM_IN
# Generous timeouts: a VM under TCG on a busy host can stall for seconds.
N="$MDVM_IN/nvraid --nbd-timeout 30s --nbd-connect-timeout 20s"
. $MDVM_IN/vmlib.sh
VM_LOGS="/tmp/*.log"
VM_DMESG=1

ip link set lo up 2> /dev/null || ifconfig lo 127.0.0.1 up
[ -d /sys/kernel/config/nvmet ] || mount -t configfs none /sys/kernel/config
NB=/sys/kernel/config/nullb
C=/sys/kernel/config/nvmet
NQN=nqn.2026-11.io.nvraid.test
P=$C/ports/1
M=""
M3=""
for i in 0 1 2 3; do
	mkdir $NB/nvr$i
	echo 1 > $NB/nvr$i/memory_backed
	echo 512 > $NB/nvr$i/blocksize
	echo 64 > $NB/nvr$i/size
	echo 1 > $NB/nvr$i/power
	# 6.12 names the disk after the configfs item.
	dev=/dev/nvr$i
	wait_for -b $dev
	S=$C/subsystems/$NQN:d$i
	mkdir $S
	echo 1 > $S/attr_allow_any_host
	mkdir $S/namespaces/1
	echo $dev > $S/namespaces/1/device_path
	echo 1 > $S/namespaces/1/enable
	# The first two members with header and data digests (CRC32C).
	case $i in 0|1) Q="?digest=header,data" ;; *) Q="" ;; esac
	M="$M nvme+tcp://127.0.0.1/$NQN:d$i$Q"
	[ $i = 2 ] || M3="$M3 nvme+tcp://127.0.0.1/$NQN:d$i$Q"
done
mkdir $P
echo tcp > $P/addr_trtype
echo ipv4 > $P/addr_adrfam
echo 127.0.0.1 > $P/addr_traddr
echo 4420 > $P/addr_trsvcid
for i in 0 1 2 3; do ln -s $C/subsystems/$NQN:d$i $P/subsystems/$NQN:d$i; done
echo "NVMET 4 subsystems on 127.0.0.1:4420"

# A RAID 5 over the four namespaces; a pattern written and read back.
$N create --level 5 --chunk 64K $M > /tmp/create.log 2>&1 || fail "create"
$N detail $M > /tmp/detail.log 2>&1 || fail "detail"
grep -q "raid5" /tmp/detail.log || fail "detail does not say raid5"
echo "CREATED raid5 of 4 nvme+tcp members"
pattern cat -s 1 8388608 > /tmp/p1
$N write -i /tmp/p1 $M > /tmp/write1.log 2>&1 || fail "write"
$N read --length 8388608 -o /tmp/r1 $M > /tmp/read1.log 2>&1 || fail "read"
cmp /tmp/p1 /tmp/r1 || fail "read back differs"
echo "READBACK 8 MiB ok"

# One member's subsystem taken off the port while a write runs: nvmet
# drops its controller and connections, nvraid's writes to it fail, the
# member is marked faulty, the write goes on and completes.
pattern cat -s 2 67108864 > /tmp/p2
written() { awk '{ print $7 }' /sys/block/nvr0/stat; }
base=$(written)
$N write --offset 16M -i /tmp/p2 $M > /tmp/write2.log 2>&1 &
W=$!
# Once the write's data is flowing: 4 MiB of it on the first member
# (sectors written, /sys/block/*/stat), past the array's metadata updates.
n=0
while [ $(($(written) - base)) -lt 8192 ] && [ -d /proc/$W ]; do
	n=$((n + 1)); [ $n -lt 1200 ] || fail "the write never wrote to the first member"
	sleep 0.05
done
kill -0 $W 2> /dev/null && echo "WRITER running when the port link went" || echo "WRITER done before the port link went"
rm $P/subsystems/$NQN:d2
wait $W || fail "the write under a lost member failed (exit $?)"
grep "marked faulty" /tmp/write2.log
echo "WRITE under a lost member ok"
# The lost member cannot be opened (its subsystem is off the port): named.
! $N detail $M > /tmp/detail2.log 2>&1 || fail "detail opened a member whose subsystem left the port"
grep -q "Connect to subsystem \"$NQN:d2\"" /tmp/detail2.log || fail "the unreachable member is not named"
echo "UNREACHABLE member named"
$N detail $M3 > /tmp/detail3.log 2>&1 || fail "detail of the three"
cat /tmp/detail3.log
$N read --length 8388608 -o /tmp/r1 $M3 > /tmp/read2.log 2>&1 || fail "degraded read 1"
cmp /tmp/p1 /tmp/r1 || fail "degraded read of the first pattern differs"
$N read --offset 16M --length 67108864 -o /tmp/r2 $M3 > /tmp/read3.log 2>&1 || fail "degraded read 2"
cmp /tmp/p2 /tmp/r2 || fail "degraded read of the second pattern differs"
rm /tmp/r2
echo "DEGRADED READ ok"

# The member's port comes back: the array assembles from the four, the
# stale member recorded faulty (exit 3: degraded), the data reads the same;
# the member added back is rebuilt and the array is whole again.
ln -s $C/subsystems/$NQN:d2 $P/subsystems/$NQN:d2
rc=0; $N assemble $M > /tmp/assemble.log 2>&1 || rc=$?
[ $rc = 3 ] || fail "assemble with the stale member exited $rc, expected 3 (degraded)"
grep -q "d2 .*the array records it as faulty" /tmp/assemble.log || fail "the stale member is not shown faulty"
$N read --length 8388608 -o /tmp/r1 $M > /tmp/read4.log 2>&1 || fail "read after reassembly"
cmp /tmp/p1 /tmp/r1 || fail "read after reassembly differs"
echo "REASSEMBLED degraded, stale member faulty"
$N add --new nvme+tcp://127.0.0.1/$NQN:d2 $M3 > /tmp/add.log 2>&1 || fail "add back"
$N detail $M > /tmp/detail5.log 2>&1 || fail "detail after the rebuild"
cat /tmp/detail5.log
grep -q "State : clean$" /tmp/detail5.log || fail "not clean after the rebuild"
$N check $M > /tmp/check.log 2>&1 || fail "check after the rebuild"
$N read --offset 16M --length 67108864 -o /tmp/r2 $M > /tmp/read5.log 2>&1 || fail "read 2 after the rebuild"
cmp /tmp/p2 /tmp/r2 || fail "read 2 after the rebuild differs"
echo "REBUILT clean, parity checked"

# The fast path: workers, each with its own pipelined I/O queue per
# member, random 4K reads and writes; the array stays clean (no member
# failed) and its parity is right afterwards.
$N bench --destructive --rw randrw --bs 4k --iodepth 16 --numjobs 2 --runtime 3s $M > /tmp/bench.log 2>&1 || fail "bench"
cat /tmp/bench.log
$N detail $M > /tmp/detail6.log 2>&1 || fail "detail after the bench"
grep -q "State : clean$" /tmp/detail6.log || fail "not clean after the bench"
$N check $M > /tmp/check2.log 2>&1 || fail "check after the bench"
cat /tmp/check2.log
echo "BENCH fast path ok, parity checked"

# Served: the array as /dev/ublkb0 (nvraid serve's workers, each with its
# own I/O queue per member); 16 MiB written through it with O_DIRECT and
# read back equal, through the device and from the members after SIGTERM.
$N serve --ublk 0 $M 2> /tmp/srv1.log &
S=$!
wait_for -b /dev/ublkb0
pattern cat -s 4 16777216 > /tmp/p4
dd if=/tmp/p4 of=/dev/ublkb0 bs=128k oflag=direct 2> /dev/null || fail "dd to /dev/ublkb0"
dd if=/dev/ublkb0 of=/tmp/r4 bs=128k count=128 iflag=direct 2> /dev/null || fail "dd from /dev/ublkb0"
cmp /tmp/p4 /tmp/r4 || fail "the served data read back differently"
kill -TERM $S
wait $S || fail "serve exited $? after SIGTERM"
$N read --length 16777216 -o /tmp/r4 $M > /tmp/read6.log 2>&1 || fail "read after serve"
cmp /tmp/p4 /tmp/r4 || fail "the served data differs on the members"
echo "SERVED over ublk ok"
