# Shell helpers for scripts run inside the kernel VM (busybox sh), shipped
# into $MDVM_IN by the tests (nvraid_testing::vm::ship); source it with
# `. $MDVM_IN/vmlib.sh` after `set -e`.
#
#   VM_LOGS      globs of logs `fail` prints (default /tmp/srv*.log)
#   VM_DMESG     non-empty: `fail` also prints the kernel log's tail
#   WAIT_TENTHS  how long wait_for/wait_log wait, in tenths of a second
#                (default 600: 60 s)

# Milliseconds since boot.
ms() { read up rest < /proc/uptime; echo "${up%.*}${up#*.}0"; }

# Print FAIL and the logs, and stop the script.
fail() {
	echo "FAIL: $*"
	for f in ${VM_LOGS:-/tmp/srv*.log}; do
		[ -e "$f" ] || continue
		echo "== $f"; cat "$f"
	done
	[ -z "$VM_DMESG" ] || dmesg | tail -40
	exit 1
}

# wait_for TEST-ARGS...: until `[ TEST-ARGS ]` holds.
wait_for() {
	n=0
	while ! [ "$@" ]; do
		n=$((n + 1)); [ $n -lt "${WAIT_TENTHS:-600}" ] || fail "timed out waiting for [ $* ]"
		sleep 0.1
	done
}

# wait_log FILE TEXT: until FILE holds TEXT.
wait_log() {
	n=0
	while ! grep -q "$2" "$1" 2> /dev/null; do
		n=$((n + 1)); [ $n -lt "${WAIT_TENTHS:-600}" ] || fail "timed out waiting for '$2' in $1"
		sleep 0.1
	done
}

# write_files DIR N: files f1..fN of 1 MiB, file i holding pattern seed i.
write_files() {
	i=1
	while [ $i -le "$2" ]; do
		pattern cat -s $i 1048576 > "$1/f$i"
		i=$((i + 1))
	done
}

# Processes in uninterruptible sleep (D state), by name.
stuck() {
	for s in /proc/[0-9]*/status; do
		grep -q '^State:.*D' $s 2> /dev/null && sed -n 's/^Name:\s*//p' $s
	done | tr '\n' ' '
}
