# boot/package.rs's guest script, run by tools/bootvm in the Debian trixie machine.
# Disks: nv0 and nv2 are the RAID 1's members, nv1 a blank disk between them.
# BOOT=1: install the .deb in $BOOTVM_IN with apt (no network: every dependency must
# already be on the machine), check what it installed, remove it, check the member
# is untouched, leave a marker on the root filesystem (synced); then the host cuts
# the power. BOOT=2 (the same root after the power cut, the blank disk left out):
# the marker is there, nv2 is still the second member, the package's configuration
# left behind by the removal is purged, the member still untouched; a clean poweroff.
# Each step prints one line the test checks; any failure exits non-zero.
set -euo pipefail
fail() { echo "FAIL: $*"; exit 1; }
member=/dev/disk/by-id/virtio-nv0
[ -b "$member" ] || fail "no $member"
member_sum() { head -c 8M "$member" | sha256sum | cut -d' ' -f1; }
[ "$(member_sum)" = "$MEMBER_SHA" ] || fail "the member's first 8 MiB differ from the host's before anything ran"
echo "MDSTAT $(grep -c '^md' /proc/mdstat || true) arrays of the kernel's md"

case "$BOOT" in
1)
	cd "$BOOTVM_IN"
	deb=$(ls nvraid_*.deb)
	# apt with the local file, as a user would; the machine has no network device,
	# so it installs only if every dependency the package declares is already there
	DEBIAN_FRONTEND=noninteractive apt-get install -y "./$deb" > apt.log 2>&1 ||
		{ cat apt.log; fail "apt-get install ./$deb"; }
	echo "INSTALLED $(dpkg-query -W -f '${Package} ${Version} ${Status}' nvraid)"
	echo "VERSION $(nvraid --version)"
	echo "BINARY $(command -v nvraid)"
	# man pages: where man looks, and roff inside
	zcat /usr/share/man/man1/nvraid.1.gz | grep -q '^\.TH nvraid' || fail "nvraid.1.gz is not nvraid's man page"
	echo "MAN $(ls /usr/share/man/man1/nvraid*.1.gz | wc -l) pages"
	# completions: bash loads its file and completes nvraid; zsh and fish files in place
	bash -c '. /usr/share/bash-completion/completions/nvraid && complete -p nvraid' > complete.out ||
		fail "the bash completion does not load"
	grep -q 'nvraid' complete.out || fail "bash: $(cat complete.out)"
	grep -q '^#compdef nvraid' /usr/share/zsh/vendor-completions/_nvraid || fail "zsh completion"
	grep -q 'complete -c nvraid' /usr/share/fish/vendor_completions.d/nvraid.fish || fail "fish completion"
	echo "COMPLETIONS bash zsh fish"
	# every unit the package installed is known to systemd (a template by an instance)
	units=0
	for f in $(dpkg -L nvraid | grep '^/usr/lib/systemd/system/.' || true); do
		[ -f "$f" ] || continue
		u=${f##*/}
		case "$u" in *@.*) u=${u/@./@x.} ;; esac
		systemctl cat "$u" > /dev/null || fail "systemd does not know $u"
		units=$((units + 1))
	done
	echo "UNITS $units known to systemd"
	rules=0
	for f in $(dpkg -L nvraid | grep '^/usr/lib/udev/rules.d/.' || true); do
		[ -f "$f" ] || continue
		udevadm verify "$f" > /dev/null || fail "udevadm verify $f"
		rules=$((rules + 1))
	done
	echo "RULES $rules verified by udevadm"
	conf=absent
	[ -f /etc/nvraid/nvraid.conf ] && conf=present
	echo "CONF $conf"
	DEBIAN_FRONTEND=noninteractive apt-get remove -y nvraid > apt.log 2>&1 ||
		{ cat apt.log; fail "apt-get remove nvraid"; }
	! command -v nvraid > /dev/null || fail "nvraid is still on PATH after the removal"
	[ ! -e /usr/share/man/man1/nvraid.1.gz ] || fail "the man page is still there"
	for f in $(ls /usr/lib/systemd/system/ | grep '^nvraid' || true); do fail "unit $f left"; done
	echo "REMOVED $(dpkg-query -W -f '${Status}' nvraid 2>/dev/null || echo 'not known')"
	[ "$(member_sum)" = "$MEMBER_SHA" ] || fail "the member's first 8 MiB changed"
	echo "MEMBER unchanged"
	mkdir -p /var/lib/boot-package
	echo "$MARK" > /var/lib/boot-package/mark
	sync
	echo "MARK written"
	;;
2)
	[ "$(cat /var/lib/boot-package/mark)" = "$MARK" ] || fail "the mark written in the first boot is gone"
	echo "MARK read"
	# the blank disk between the members is left out this time: the second member
	# keeps its name
	[ ! -e /dev/disk/by-id/virtio-nv1 ] || fail "virtio-nv1 is there, left out by the host"
	[ "$(head -c 8M /dev/disk/by-id/virtio-nv2 | sha256sum | cut -d' ' -f1)" = "$MEMBER2_SHA" ] ||
		fail "virtio-nv2 is not the second member"
	echo "DISKS nv0 nv2, nv1 left out"
	echo "LEFT $(dpkg-query -W -f '${Status}' nvraid 2>/dev/null || echo 'not known')"
	DEBIAN_FRONTEND=noninteractive apt-get purge -y nvraid > apt.log 2>&1 ||
		{ cat apt.log; fail "apt-get purge nvraid"; }
	[ ! -e /etc/nvraid/nvraid.conf ] || fail "purge left /etc/nvraid/nvraid.conf"
	echo "PURGED $(dpkg-query -W -f '${Status}' nvraid 2>/dev/null || echo 'not known')"
	[ "$(member_sum)" = "$MEMBER_SHA" ] || fail "the member's first 8 MiB changed"
	echo "MEMBER unchanged"
	;;
*) fail "BOOT must be 1 or 2" ;;
esac
echo "BOOT $BOOT done, $(systemctl is-system-running || true)"
if [ "$BOOT" = 1 ]; then
	# the host cuts the power on this line: nothing after it runs
	echo "CUT"
	sleep 600
	fail "still running after the power cut"
fi
