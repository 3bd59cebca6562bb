#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine or a developer's: installs
# the test peers that are missing (apt-get, as root), then runs every test.
#
#   ./test.sh                 # everything
#   ./test.sh -p nvraid-array # extra arguments go to `cargo test --workspace`
set -euo pipefail
cd "$(dirname "$0")"

# Each entry: a command (or file) that must exist, and the Debian package
# that provides it.
needs=(
    "mdadm mdadm"                    # interop: mdadm --examine; the kernel VM's mdadm
    "xz xz-utils"                    # kernel md fixtures are xz-compressed
    "mkfs.ext4 e2fsprogs"            # filesystem signatures; mkfs on the NBD export
    "mkfs.xfs xfsprogs"              # mkfs.xfs/xfs_repair on the host and (shipped) in the ublk VM tests
    "dmsetup dmsetup"                # kernel_ublk_faults: a member behind dm-error in the VM
    "fio fio"                        # peer for the benchmark and the NBD export
    "pgrep procps"                   # cli/tests/monitor.rs: a killed alert program left nothing running
    "nbdkit nbdkit"                  # NBD peers and clients
    "nbdinfo libnbd-bin"
    "nbdfuse nbdfuse"
    "nbd.py:/usr/lib/python3/dist-packages/nbd.py python3-libnbd"   # libnbd for tools/nbd-conformance
    "nbd-client nbd-client"          # the kernel NBD client inside the VM (power-loss test)
    "fusermount3 fuse3"
    "qemu-img qemu-utils"            # qemu-img / qemu-io / qemu-nbd clients
    "openssl openssl"                # test certificates for NBD over TLS
    "ip iproute2"                    # bench/san: network namespaces, veth, tc shaping
    "tc iproute2"
    "python3 python3"                # bench/san is a Python script
    "chromium chromium"              # nvraid-report: the page is checked in a real browser
    "qemu-system-x86_64 qemu-system-x86"   # tools/mdvm: the kernel md VM
    "busybox:/bin/busybox busybox-static"
    "cpio cpio"
    "modprobe kmod"
    "depmod kmod"                    # tools/mdvm/fetch-kernel: trixie's 6.12 kernel for the VM
    "dpkg-deb dpkg"
    "apt-get apt"
    "keyring:/usr/share/keyrings/debian-archive-keyring.gpg debian-archive-keyring"
    "zstd zstd"                      # the 6.12 kernel image is zstd-compressed
    "objcopy binutils"
    "gcc gcc"
    "libc.a:/usr/lib/x86_64-linux-gnu/libc.a libc6-dev"
    "dpkg-source dpkg-dev"           # tools/mdvm/build-fio: fio for the VM from Debian's source
    "make make"
    "libz.a:/usr/lib/x86_64-linux-gnu/libz.a zlib1g-dev"
    "systemd-analyze systemd"        # tests/dist.rs: the units in dist/systemd pass systemd-analyze verify
    "mmdebstrap mmdebstrap"          # tools/bootvm/mkroot: the Debian trixie machine of the reboot tests
    "debugfs e2fsprogs"              # tools/bootvm/bootvm: Debian's initramfs read from the root image
    "qemu-storage-daemon qemu-system-common"   # ... of a qcow2 overlay, through a FUSE view
    "dpkg-shlibdeps dpkg-dev"        # dist/build-deb: the package's Depends
    "strip binutils"
)
missing=()
for entry in "${needs[@]}"; do
    what=${entry%% *} package=${entry##* }
    case "$what" in
    *:*) [ -e "${what#*:}" ] || missing+=("$package") ;;
    *) command -v "$what" >/dev/null 2>&1 || missing+=("$package") ;;
    esac
done
# The VM boots an installed Debian kernel that has md as modules.
if ! compgen -G "/boot/vmlinuz-*" >/dev/null; then
    missing+=(linux-image-amd64)
fi

if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "test.sh: missing test peers: ${missing[*]}; install them as root:" >&2
        echo "  apt-get install ${missing[*]}" >&2
        exit 1
    fi
    echo "test.sh: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    extra=()
    # Debian's qemu-system-x86 wants the qemu-utils of its own version; a
    # newer qemu-utils (from backports) is brought to that version.
    if [[ " ${missing[*]} " == *" qemu-system-x86 "* ]]; then
        version=$(apt-cache policy qemu-system-common | awk '/Candidate:/ {print $2}')
        missing=("${missing[@]/qemu-utils/}")
        extra=(--allow-downgrades "qemu-utils=$version")
    fi
    apt-get install -y -qq --no-install-recommends "${extra[@]}" ${missing[*]} >/dev/null
fi

# The VM's second kernel (Debian trixie's 6.12, for ublk): fetched once into
# the cache, so that the first test that boots it does not pay for the download.
tools/mdvm/fetch-kernel > /dev/null
# The reboot tests' Debian machine (tools/bootvm): built once (mmdebstrap) and
# cached under /var/tmp/nvraid-vm, likewise.
tools/bootvm/mkroot > /dev/null

cargo test --workspace "$@"
