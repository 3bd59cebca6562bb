//! What tests that run a kernel VM (`tools/mdvm`) share: host tools found
//! by name, and the directory the VM sees as `$MDVM_IN`, with binaries and
//! the shared libraries they load (the VM's initramfs carries libc only).

use std::path::{Path, PathBuf};
use std::process::Command;

/// A host tool by name, from the sbin and bin directories; a failure that
/// says how to get it when it is missing.
pub fn host_tool(name: &str) -> PathBuf {
    for dir in ["/usr/sbin", "/sbin", "/usr/bin", "/bin"] {
        let path = Path::new(dir).join(name);
        if path.exists() {
            return path;
        }
    }
    panic!("{name} not found on the host: run ./test.sh (it installs the test peers)");
}

/// The shell helpers VM scripts source (`. $MDVM_IN/vmlib.sh`).
const VMLIB: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tools/mdvm/scripts/vmlib.sh"
);

/// `dir/in`, made for the VM's `--indir`: each of `binaries` and every
/// shared library it loads but libc (which the VM has), and `vmlib.sh`
/// (tools/mdvm/scripts). Run them inside with `LD_LIBRARY_PATH=$MDVM_IN`.
/// The binaries go without their debug information (`strip
/// --strip-debug`, binutils): the guest unpacks its initramfs into RAM,
/// and a debug build of nvraid (about 140 MB) left too little of a 512 MiB
/// guest for the rest of it to unpack.
pub fn ship(dir: &Path, binaries: &[PathBuf]) -> PathBuf {
    let inside = dir.join("in");
    std::fs::create_dir_all(&inside).unwrap();
    std::fs::copy(VMLIB, inside.join("vmlib.sh")).unwrap_or_else(|e| panic!("{VMLIB}: {e}"));
    for binary in binaries {
        let name = binary
            .file_name()
            .unwrap_or_else(|| panic!("{}: not a file", binary.display()));
        std::fs::copy(binary, inside.join(name))
            .unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
        let stripped = std::process::Command::new("strip")
            .arg("--strip-debug")
            .arg(inside.join(name))
            .status()
            .unwrap_or_else(|e| panic!("strip (apt-get install binutils): {e}"));
        assert!(
            stripped.success(),
            "strip --strip-debug {}",
            binary.display()
        );
        for lib in libraries(binary) {
            let Some(name) = lib.file_name() else {
                continue;
            };
            if !name.to_string_lossy().starts_with("libc.so") && !inside.join(name).exists() {
                std::fs::copy(&lib, inside.join(name))
                    .unwrap_or_else(|e| panic!("{}: {e}", lib.display()));
            }
        }
    }
    inside
}

/// The shared libraries `binary` loads, as `ldd` resolves them.
fn libraries(binary: &Path) -> Vec<PathBuf> {
    let ldd = Command::new("ldd")
        .arg(binary)
        .output()
        .unwrap_or_else(|e| panic!("ldd {}: {e}", binary.display()));
    String::from_utf8_lossy(&ldd.stdout)
        .lines()
        .filter_map(|line| line.split("=>").nth(1)?.split_whitespace().next())
        .map(PathBuf::from)
        .collect()
}
