#!/usr/bin/env bash
# nvraid write/read of 1 GiB through a 4-member RAID 0 on tmpfs, next to dd
# of the same size on one tmpfs file, alternating, 3 repetitions.
# Usage: bench/io-vs-dd.sh [SIZE_MIB]   (default 1024)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
nvraid=${NVRAID:-$root/target/release/nvraid}
[ -x "$nvraid" ] || (cd "$root" && cargo build --release -p nvraid)
mib=${1:-1024}
dir=$(mktemp -d /dev/shm/nvraid-io-vs-dd.XXXXXX)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
head -c $((mib << 20)) /dev/urandom > input.bin   # the source, on tmpfs too
"$nvraid" create --level 0 --size $(( (mib / 4 + 2) ))M m0 m1 m2 m3 >/dev/null

rate() { # bytes seconds -> MB/s
    python3 -c "print(f'{$1 / $2 / 1e6:8.0f}')"
}
timed() { # command... -> seconds
    local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null 2>&1; t1=$(date +%s.%N)
    python3 -c "print($t1 - $t0)"
}
bytes=$((mib << 20))
printf '%-4s %-28s %10s\n' rep what MB/s
for rep in 1 2 3; do
    t=$(timed "$nvraid" write --input input.bin m0 m1 m2 m3)
    printf '%-4s %-28s %10s\n' $rep "nvraid write (4x RAID 0)" "$(rate $bytes $t)"
    t=$(timed dd if=input.bin of=dd.bin bs=4M conv=fdatasync)
    printf '%-4s %-28s %10s\n' $rep "dd write (1 file)" "$(rate $bytes $t)"
    t=$(timed "$nvraid" read --length $bytes --output out.bin m0 m1 m2 m3)
    cmp -s out.bin input.bin || { echo "read-back differs" >&2; exit 1; }
    printf '%-4s %-28s %10s\n' $rep "nvraid read (4x RAID 0)" "$(rate $bytes $t)"
    t=$(timed dd if=dd.bin of=out.bin bs=4M)
    printf '%-4s %-28s %10s\n' $rep "dd read (1 file)" "$(rate $bytes $t)"
done
