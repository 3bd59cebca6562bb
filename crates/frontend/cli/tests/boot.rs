//! The tests on a whole Debian trixie machine booted with systemd
//! (`tools/bootvm`): the Debian package, the reboot scenarios of an array
//! that lives in fstab, and the bed itself. One test binary, so that the
//! machines (each runs on one host core: single-threaded TCG) boot side by
//! side.

mod common;

#[path = "boot/array.rs"]
mod array;
#[path = "boot/bed.rs"]
mod bed;
#[path = "boot/hotplug.rs"]
mod hotplug;
#[path = "boot/package.rs"]
mod package;
