# boot/hotplug.rs's guest script, run by tools/bootvm in the Debian trixie
# machine after multi-user.target. Disks: nv0..nv2 an nvraid RAID 5 made on
# the host (nv1 behind its own PCIe root port: bootvm --hotplug 1). The
# package is installed and the array declared; udev starts it. Then nv1 is
# pulled while the array runs and plugged back: each step prints one line
# the host test checks; any failure prints the journal and exits non-zero.
set -euo pipefail
fail() {
	echo "FAIL: $*"
	journalctl -b --no-pager -t nvraid -u 'nvraid*' -u systemd-udevd | tail -60 || true
	exit 1
}
disk() { echo /dev/disk/by-id/virtio-nv$1; }
wait_for() {
	local limit=$(($1 * 10)) n=0
	shift
	while ! [ "$@" ]; do
		n=$((n + 1))
		[ $n -lt $limit ] || fail "timed out waiting for [ $* ]"
		sleep 0.1
	done
}
CTL=/run/nvraid/hp.ctl
status_json() { nvraid status --json --socket $CTL | tr -d ' \n'; }
# members in a state (by the metrics endpoint: the running array's view)
members_in() {
	exec 3<> /dev/tcp/127.0.0.1/9581 || { echo none; return 0; }
	printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3
	grep -E "^nvraid_array_members\{.*state=\"$1\"\}" <&3 | awk '{print $2}' || true
	exec 3<&-
}
wait_members() {
	local n=0
	until [ "$(members_in "$1")" = "$2" ] || [ "$(members_in "$1")" = "$2.0" ]; do
		n=$((n + 1)); [ $n -lt 1200 ] || fail "$1 members not $2: $(status_json)"
		sleep 0.2
	done
}

cd "$BOOTVM_IN"
mdadm --stop --scan > /dev/null 2>&1 || true
DEBIAN_FRONTEND=noninteractive apt-get install -y ./nvraid_*.deb > apt.log 2>&1 ||
	{ cat apt.log; fail "apt-get install"; }
nvraid config add "$(disk 0)" --name hp --metrics 127.0.0.1:9581 > config.log 2>&1 ||
	{ cat config.log; fail "config add"; }
udevadm trigger --action=add --subsystem-match=block
udevadm settle -t 60 || true
wait_for 180 -b /dev/nvraid/hp
wait_members active 3
echo "SERVED $(readlink -f /dev/nvraid/hp) $(systemctl is-active nvraid@hp.service)"
head -c $((4 << 20)) /dev/urandom > before.bin
dd if=before.bin of=/dev/nvraid/hp bs=1M oflag=direct status=none || fail "dd before"

# Pulled while the array runs: udev's remove event has the daemon fail
# and remove it.
echo "BOOTVM_UNPLUG_${BOOTVM_NONCE} 1"
wait_for 60 ! -e "$(disk 1)"
wait_members missing 1
echo "UNPLUGGED nv1 missing from the running array"
# Written while it is away: 2 MiB at 16 MiB of the array.
head -c $((2 << 20)) /dev/urandom > away.bin
dd if=away.bin of=/dev/nvraid/hp bs=1M seek=16 oflag=direct status=none || fail "dd away"
sync
# Plugged back: udev's add event has the daemon re-add it by the bitmap.
echo "BOOTVM_PLUG_${BOOTVM_NONCE} 1"
wait_for 60 -e "$(disk 1)"
wait_members active 3
copied=$(status_json | grep -o '"rebuild":{[^}]*}' | grep -o '"copied_bytes":[0-9]*' || true)
echo "REPLUGGED active again, $copied of $(blockdev --getsize64 "$(disk 1)") bytes"
echo "UDEV-SAID $(journalctl -b --no-pager -t nvraid -o cat | grep -oE 'went away: [a-z]+|went away; [a-z]+|is back: [^,]*' | tr '\n' ';')"
# Every byte written reads back, through the member that came back too:
# read again with each other member failed in turn would need a restart;
# the host checks the parity of the whole array after the poweroff.
dd if=/dev/nvraid/hp bs=1M count=4 iflag=direct status=none | cmp - before.bin || fail "before.bin differs"
dd if=/dev/nvraid/hp bs=1M skip=16 count=2 iflag=direct status=none | cmp - away.bin || fail "away.bin differs"
echo "VERIFIED 6 MiB"
systemctl stop nvraid@hp.service
echo "STOPPED $(systemctl is-active nvraid@hp.service || true)"
