# boot/array.rs's guest script, run by tools/bootvm in the Debian trixie machine
# after multi-user.target, once per boot of the same machine; PHASE says which.
# Disks: nv0..nv3 an nvraid RAID 5 made on the host, nv4 and nv5 blank (a kernel
# md RAID 1 made here). Each step prints one line the host test checks; any
# failure prints the units' journal and exits non-zero.
set -euo pipefail
fail() {
	echo "FAIL: $*"
	journalctl -b --no-pager -u 'nvraid*' -u 'srv-data.mount' -u 'mdadm*' -u systemd-udevd | tail -80 || true
	cat /proc/mdstat || true
	exit 1
}
disk() { echo /dev/disk/by-id/virtio-nv$1; }
# progress, with the guest's uptime
at() { echo "AT $1 $(cut -d' ' -f1 /proc/uptime)"; }
STATE=/var/lib/boot-array
CTL=/run/nvraid/data.ctl
# seconds (of uptime) when a unit became active
active_at() {
	awk -v t="$(systemctl show "$1" -p ActiveEnterTimestampMonotonic --value)" \
		'BEGIN { printf "%.1f", t / 1000000 }'
}
# wait_for SECONDS TEST-ARGS...
wait_for() {
	local limit=$(($1 * 10)) n=0
	shift
	while ! [ "$@" ]; do
		n=$((n + 1))
		[ $n -lt $limit ] || fail "timed out waiting for [ $* ]"
		sleep 0.1
	done
}
status_json() { nvraid status --json --socket $CTL; }
# the status's "resync" object, on one line (no jq in the machine)
resync_json() { status_json | tr -d ' \n' | grep -o '"resync":{[^}]*}' || true; }
# the Prometheus endpoint's lines matching a regex
metrics() {
	exec 3<> /dev/tcp/127.0.0.1/9580
	printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3
	grep -E "$1" <&3 || true
	exec 3<&-
}
# every file of a sums list (sha256sum format, paths on /srv/data) reads back
verify_sums() {
	(cd /srv/data && sha256sum --quiet -c "$1") || fail "files differ from their sums ($1)"
	echo "$(wc -l < "$1")"
}
# the array is up, mounted from fstab at boot, and resynced nothing
mounted() {
	findmnt -n /srv/data > /dev/null || fail "/srv/data is not mounted"
	local src
	src=$(findmnt -n -o SOURCE /srv/data)
	echo "MOUNTED /srv/data from $src at $(active_at srv-data.mount) s of uptime (nvraid@data active at $(active_at nvraid@data.service) s)"
	echo "MDSTAT $(grep '^md' /proc/mdstat | sed 's/ : /:/' | cut -d' ' -f1-3 | tr '\n' ';')"
}
# fio_verifying NAME LOG: fio writes and verifies (crc32c, as it goes) a
# file on /srv/data in the background ($FIO), for a few seconds before
# this returns
fio_verifying() {
	fio --name=$1 --filename=/srv/data/fio.dat --size=16m --bs=4k --rw=randwrite \
		--ioengine=psync --direct=1 --verify=crc32c --verify_backlog=64 --loops=2 \
		--output=$2 > /dev/null 2>&1 &
	FIO=$!
	sleep 4
	kill -0 $FIO 2> /dev/null || fail "fio $1 ended too soon: $(cat $2)"
}
no_resync() {
	local resynced
	resynced=$(journalctl -b --no-pager -u nvraid@data | grep -ci 'resync' || true)
	echo "RESYNC $resynced lines; state before start: $(cat $STATE/state-at-boot)"
}

# What the array's superblock said before the service started this boot (by
# the unit nvraid-boot-probe.service the setup installs): clean or active.
case "$PHASE" in
setup)
	cd "$BOOTVM_IN"
	# What a user finds: mdadm's udev rule took nvraid's array at boot.
	echo "MDGRAB $(grep -c '^md' /proc/mdstat || true) arrays assembled by the kernel's md before nvraid was installed"
	mdadm --stop --scan > /dev/null 2>&1 || true
	at install
	DEBIAN_FRONTEND=noninteractive apt-get install -y ./nvraid_*.deb > apt.log 2>&1 ||
		{ cat apt.log; fail "apt-get install"; }
	# A kernel md RAID 1 on two other disks, in mdadm.conf: it must go on
	# assembling at boot.
	mdadm --create /dev/md/kmd --run --metadata=1.2 --level=1 --raid-devices=2 \
		"$(disk 4)" "$(disk 5)" > mdadm.log 2>&1 || { cat mdadm.log; fail "mdadm --create"; }
	# /dev/md/kmd is udev's link, made after mdadm returns (on a loaded
	# host, seen missing at the next line).
	udevadm settle --timeout=120
	mdadm --detail --brief /dev/md/kmd >> /etc/mdadm/mdadm.conf
	nvraid config add "$(disk 0)" --name data > config.log 2>&1 || { cat config.log; fail "config add"; }
	echo "CONFIG $(grep '^ARRAY' /etc/nvraid/nvraid.conf); mdadm.conf: $(grep -c '^ARRAY <ignore>' /etc/mdadm/mdadm.conf) ignore line"
	install -m 755 alert /usr/local/sbin/nvraid-alert
	printf 'PROGRAM /usr/local/sbin/nvraid-alert\nMETRICS 127.0.0.1:9580\n' >> /etc/nvraid/nvraid.conf
	nvraid config check > check.log 2>&1 || { cat check.log; fail "config check"; }
	# The superblock's state before nvraid starts, each boot: a unit of this
	# test (not of nvraid) ordered before the array's service.
	mkdir -p $STATE
	cat > /etc/systemd/system/boot-array-probe@.service <<-'EOF'
		[Unit]
		DefaultDependencies=no
		Before=nvraid@%i.service
		[Service]
		Type=oneshot
		ExecStart=/bin/sh -c 'nvraid examine --json /dev/disk/by-id/virtio-nv0 | tr "," "\\n" | sed -n "s/.*\\"state\\": *\\"\\([a-z]*\\)\\".*/\\1/p" | head -1 > /var/lib/boot-array/state-at-boot'
	EOF
	mkdir -p /etc/systemd/system/nvraid@data.service.d
	printf '[Unit]\nWants=boot-array-probe@%%i.service\n' > /etc/systemd/system/nvraid@data.service.d/probe.conf
	systemctl daemon-reload
	at update-initramfs
	update-initramfs -u > initramfs.log 2>&1 || { cat initramfs.log; fail "update-initramfs"; }
	# The members were there before the package: udev is asked again, as a
	# user would (or a reboot would do).
	at udev-trigger
	udevadm trigger --action=add --subsystem-match=block
	udevadm settle -t 60 || true
	wait_for 120 -b /dev/nvraid/data
	echo "SERVED $(readlink -f /dev/nvraid/data) $(systemctl is-active nvraid@data.service)"
	echo "MDSTAT $(grep '^md' /proc/mdstat | sed 's/ : /:/' | cut -d' ' -f1-3 | tr '\n' ';')"
	at mkfs
	mkfs.xfs -q -f /dev/nvraid/data || fail "mkfs.xfs"
	mkdir -p /srv/data
	echo "/dev/nvraid/data /srv/data xfs defaults 0 2" >> /etc/fstab
	systemctl daemon-reload
	mount /srv/data || fail "mount /srv/data"
	for i in $(seq 1 20); do
		head -c $((256 * 1024 + i * 4096)) /dev/urandom > /srv/data/f$i
	done
	(cd /srv/data && sha256sum f*) > $STATE/sums
	sync
	echo "SETUP 20 files on XFS on /dev/nvraid/data"
	;;
clean)
	# A clean reboot: mounted from fstab, no resync; then a restart of the
	# array's service under fio: the filesystem stays, fio sees no error.
	mounted
	no_resync
	echo "VERIFIED $(verify_sums $STATE/sums) files"
	fio_verifying restart /tmp/fio.log
	systemctl restart nvraid@data.service || fail "systemctl restart nvraid@data"
	wait $FIO || fail "fio failed across the restart: $(cat /tmp/fio.log)"
	findmnt -n /srv/data > /dev/null || fail "/srv/data was unmounted by the restart"
	left=$(journalctl -b --no-pager -u nvraid@data | grep -c 'ublk-left-for-next-server' || true)
	taken=$(journalctl -b --no-pager -u nvraid@data | grep -c 'ublk-reattached' || true)
	echo "RESTARTED under fio: fio ok ($(grep -o 'err= *[0-9]*' /tmp/fio.log | head -1)), left $left, taken over $taken"
	# kill -9 of the daemon under fio: systemd restarts the service
	# (Restart=on-failure), the new daemon takes the device over (ublk's
	# user recovery), fio goes on and verifies.
	fio_verifying killed /tmp/fio2.log
	systemctl kill --signal=KILL nvraid@data.service
	wait $FIO || fail "fio failed across the kill -9: $(cat /tmp/fio2.log)"
	findmnt -n /srv/data > /dev/null || fail "/srv/data was unmounted by the kill"
	n=0
	until systemctl is-active --quiet nvraid@data.service; do
		n=$((n + 1)); [ $n -lt 600 ] || fail "nvraid@data is not active again after the kill"
		sleep 0.1
	done
	taken=$(journalctl -b --no-pager -u nvraid@data | grep -c 'ublk-reattached' || true)
	echo "KILLED under fio: fio ok ($(grep -o 'err= *[0-9]*' /tmp/fio2.log | head -1)), taken over $taken times in all"
	rm -f /srv/data/fio.dat
	;;
cut)
	# Another clean reboot, then a writer and a power cut (the host kills
	# qemu when it sees SYNCED 12).
	mounted
	no_resync
	echo "VERIFIED $(verify_sums $STATE/sums) files"
	for i in $(seq 1 400); do
		head -c 262144 /dev/urandom > /tmp/w
		dd if=/tmp/w of=/srv/data/w$i bs=64k conv=fsync status=none
		echo "SYNCED $i $(sha256sum < /tmp/w | cut -d' ' -f1)"
	done
	fail "the power was not cut"
	;;
after-cut)
	# The boot after the power cut: assembled, only the bitmap's dirty
	# regions resynced, mounted (XFS replays its log), every file fsync'ed
	# before the cut reads back.
	mounted
	echo "STATE-AT-BOOT $(cat $STATE/state-at-boot)"
	n=0
	# (grep reads all of its input: with pipefail, `grep -q` ending early
	# would fail the pipeline on the writer's SIGPIPE)
	until resync_json | grep '"finished":true' > /dev/null; do
		n=$((n + 1)); [ $n -lt 600 ] || fail "the resync did not finish: $(status_json)"
		sleep 0.2
	done
	echo "RESYNCED $(resync_json)"
	echo "VERIFIED $(verify_sums $STATE/sums) files"
	echo "SYNCED-FILES $(verify_sums "$BOOTVM_IN/synced") verified"
	;;
absent)
	# nv2 left out: the array starts degraded after the timeout, mounts,
	# the alert program ran, the metrics show the member missing.
	mounted
	echo "ALERTS $(tr '\n' ';' < /var/log/nvraid-alerts 2> /dev/null || true)"
	echo "METRICS $(metrics '^nvraid_array_degraded\{|^nvraid_array_members\{.*state="missing"' | tr '\n' ';')"
	# how long the boot waited for the missing member: from the first
	# member's device unit to the array's service (systemd's device timeout
	# for the mount is 90 s)
	first=$(active_at "$(systemd-escape --path --suffix=device "$(disk 0)")")
	served=$(active_at nvraid@data.service)
	echo "WAITED $(awk -v a="$first" -v b="$served" 'BEGIN { printf "%.1f", b - a }') s from the first member to the degraded start"
	echo "VERIFIED $(verify_sums $STATE/sums) files"
	# written while nv2 is away: what its re-add must bring it
	for i in $(seq 1 8); do
		head -c 262144 /dev/urandom > /srv/data/d$i
	done
	(cd /srv/data && sha256sum d*) >> $STATE/sums
	sync
	echo "DEGRADED-WRITES 8 files"
	;;
back)
	# nv2 is back: re-added by the bitmap at the start, recovered, in sync.
	mounted
	n=0
	until journalctl -b --no-pager -u nvraid@data | grep -E 'event=re-add(ed|-refused)' > /dev/null; do
		n=$((n + 1)); [ $n -lt 600 ] || fail "no re-add in the journal"
		sleep 0.2
	done
	echo "READDED $(journalctl -b --no-pager -u nvraid@data | grep -oE 'event=re-add(ed|-refused).*' | head -1)"
	n=0
	until metrics '^nvraid_array_members\{.*state="active"\} 4(\.0)?$' | grep . > /dev/null; do
		n=$((n + 1)); [ $n -lt 1500 ] || fail "not every member active: $(status_json)"
		sleep 0.2
	done
	echo "ACTIVE 4 members"
	echo "VERIFIED $(verify_sums $STATE/sums) files"
	echo "ALERTS $(tr '\n' ';' < /var/log/nvraid-alerts 2> /dev/null || true)"
	;;
*) fail "PHASE $PHASE?" ;;
esac
echo "PHASE $PHASE done: $(systemctl is-system-running || true)"
