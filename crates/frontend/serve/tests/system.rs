//! Whole-system tests: a filesystem on the export through nbdfuse and a
//! loop device, and TLS with libnbd and qemu as clients. These need root,
//! /dev/fuse and loop devices; if one is missing the test fails saying so.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use common::{random_bytes, require, run, TestServer};
use nvraid_serve::{TlsFiles, TlsMode};
use nvraid_testing::MemTarget;

const MIB: u64 = 1 << 20;

/// nbdfuse exposing the export as a file, attached to a loop device.
struct LoopExport {
    fuse: Child,
    mountpoint: PathBuf,
    device: String,
}

impl LoopExport {
    fn attach(uri: &str, dir: &Path) -> LoopExport {
        let nbdfuse = require("nbdfuse", "nbdfuse");
        let losetup = require("losetup", "mount");
        assert!(
            Path::new("/dev/fuse").exists(),
            "/dev/fuse is missing: FUSE is not available"
        );
        assert!(
            Path::new("/dev/loop-control").exists(),
            "/dev/loop-control is missing: no loop devices"
        );
        let mountpoint = dir.join("fuse");
        std::fs::create_dir_all(&mountpoint).unwrap();
        let fuse = Command::new(nbdfuse)
            .arg(&mountpoint)
            .arg(uri)
            .spawn()
            .expect("nbdfuse starts");
        let file = mountpoint.join("nbd");
        for _ in 0..200 {
            if std::fs::metadata(&file).is_ok_and(|m| m.len() > 0) {
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        assert!(file.exists(), "nbdfuse did not expose {}", file.display());
        let output = run(Command::new(losetup).args(["-f", "--show"]).arg(&file));
        let device = String::from_utf8_lossy(&output.stdout).trim().to_string();
        LoopExport {
            fuse,
            mountpoint,
            device,
        }
    }

    fn detach(mut self) {
        run(Command::new("losetup").args(["-d", &self.device]));
        // The kernel lets go of a detached loop device's backing file a
        // moment later (its release runs after `losetup -d` returns): until
        // then the FUSE file is busy, and an unmount fails with EBUSY.
        let fusermount = require("fusermount3", "fuse3");
        let started = std::time::Instant::now();
        loop {
            let out = Command::new(&fusermount)
                .arg("-u")
                .arg(&self.mountpoint)
                .output()
                .unwrap();
            if out.status.success() {
                break;
            }
            let busy = String::from_utf8_lossy(&out.stderr).contains("busy");
            assert!(
                busy && started.elapsed() < std::time::Duration::from_secs(10),
                "fusermount3 -u {}: {}",
                self.mountpoint.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = self.fuse.wait();
        self.device.clear();
    }
}

impl Drop for LoopExport {
    fn drop(&mut self) {
        if !self.device.is_empty() {
            let _ = Command::new("losetup").args(["-d", &self.device]).status();
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.mountpoint)
                .status();
            let _ = self.fuse.kill();
            let _ = self.fuse.wait();
        }
    }
}

/// Write a tree of small files; return a checksum listing of it.
fn populate(root: &Path, files: usize) {
    for i in 0..files {
        let dir = root.join(format!("d{:02}/e{}", i % 37, i % 5));
        std::fs::create_dir_all(&dir).unwrap();
        let length = 100 + (i * 7919) % 6000;
        std::fs::write(
            dir.join(format!("f{i}")),
            random_bytes(length, i as u64 + 1),
        )
        .unwrap();
    }
}

fn checksums(root: &Path) -> String {
    let script = "find . -type f -print0 | sort -z | xargs -0 sha256sum";
    let output = run(Command::new("sh").arg("-c").arg(script).current_dir(root));
    String::from_utf8(output.stdout).unwrap()
}

fn mount(device: &str, at: &Path) {
    std::fs::create_dir_all(at).unwrap();
    run(Command::new("mount").arg(device).arg(at));
}

fn umount(at: &Path) {
    run(Command::new("umount").arg(at));
}

fn filesystem_round_trip(mkfs: &str, package: &str, fsck: &[&str], size: u64) {
    let mkfs_path = require(mkfs, package);
    let target = MemTarget::new(size, 512);
    let server = TestServer::start(target.clone());
    let work = tempfile::tempdir().unwrap();
    let mnt = work.path().join("mnt");
    let device = LoopExport::attach(&server.uri(), work.path());
    run(Command::new(&mkfs_path).arg("-q").arg(&device.device));
    mount(&device.device, &mnt);
    populate(&mnt, 3000);
    let before = checksums(&mnt);
    umount(&mnt);
    run(Command::new(require(fsck[0], package))
        .args(&fsck[1..])
        .arg(&device.device));
    device.detach();
    let dir = server.stop();
    target.crash();
    let server = TestServer::start_in(dir, target, |_| {});
    let device = LoopExport::attach(&server.uri(), work.path());
    mount(&device.device, &mnt);
    let after = checksums(&mnt);
    umount(&mnt);
    device.detach();
    assert_eq!(before.lines().count(), 3000);
    assert_eq!(before, after);
}

#[test]
fn ext4_through_nbdfuse_and_loop_survives_a_restart() {
    filesystem_round_trip(
        "mkfs.ext4",
        "e2fsprogs",
        &["fsck.ext4", "-n", "-f"],
        256 * MIB,
    );
}

#[test]
fn xfs_through_nbdfuse_and_loop_survives_a_restart() {
    filesystem_round_trip("mkfs.xfs", "xfsprogs", &["xfs_repair", "-n"], 320 * MIB);
}

/// A self-signed certificate for localhost, laid out for libnbd and qemu
/// (`ca-cert.pem` in a directory), plus the server's cert and key.
fn certificates(dir: &Path) -> (PathBuf, TlsFiles) {
    let openssl = require("openssl", "openssl");
    let certs = dir.join("pki");
    std::fs::create_dir_all(&certs).unwrap();
    let cert = dir.join("server-cert.pem");
    let key = dir.join("server-key.pem");
    run(Command::new(openssl)
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
        ])
        .args(["-addext", "subjectAltName=DNS:localhost", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert));
    std::fs::copy(&cert, certs.join("ca-cert.pem")).unwrap();
    (
        certs,
        TlsFiles {
            cert,
            key,
            client_ca: None,
        },
    )
}

fn tls_server(mode: TlsMode) -> (TestServer, PathBuf, tempfile::TempDir) {
    let keys = tempfile::tempdir().unwrap();
    let (certs, files) = certificates(keys.path());
    let server = TestServer::start_with(MemTarget::new(16 * MIB, 512), |o| {
        o.tls = mode;
        o.tls_files = Some(files);
    });
    (server, certs, keys)
}

fn tls_uri(server: &TestServer, certs: &Path) -> String {
    format!(
        "nbds+unix:///?socket={}&tls-certificates={}&tls-hostname=localhost",
        server.socket.display(),
        certs.display()
    )
}

#[test]
fn tls_required_refuses_plaintext_before_the_export_is_seen() {
    let nbdinfo = require("nbdinfo", "libnbd-bin");
    let (server, certs, _keys) = tls_server(TlsMode::Require);
    let plain = Command::new(&nbdinfo)
        .arg("--json")
        .arg(server.uri())
        .output()
        .unwrap();
    assert!(!plain.status.success(), "plaintext client was served");
    assert!(
        !String::from_utf8_lossy(&plain.stdout).contains("16777216"),
        "plaintext client saw the export size"
    );
    server.wait_log(&["client=unix:", "event=option-refused", "TLS is required"]);
    let output = run(Command::new(&nbdinfo)
        .arg("--json")
        .arg(tls_uri(&server, &certs)));
    let info: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(info["TLS"], true);
    assert_eq!(info["exports"][0]["export-size"], 16 * MIB);
    server.wait_log(&["event=tls-started"]);
}

#[test]
fn nbdcopy_over_tls_round_trips() {
    let nbdcopy = require("nbdcopy", "libnbd-bin");
    let (server, certs, keys) = tls_server(TlsMode::On);
    let source = keys.path().join("source.img");
    std::fs::write(&source, random_bytes(16 * MIB as usize, 5)).unwrap();
    let status = Command::new(&nbdcopy)
        .arg(&source)
        .arg(tls_uri(&server, &certs))
        .status()
        .unwrap();
    assert!(
        status.success(),
        "nbdcopy failed; server log:\n{}",
        server.log_lines().join("\n")
    );
    let back = keys.path().join("back.img");
    run(Command::new(&nbdcopy)
        .arg(tls_uri(&server, &certs))
        .arg(&back));
    assert!(std::fs::read(&back).unwrap() == std::fs::read(&source).unwrap());
}

#[test]
fn qemu_img_compare_over_tls() {
    let qemu_img = require("qemu-img", "qemu-utils");
    let (server, certs, keys) = tls_server(TlsMode::Require);
    let data = random_bytes(16 * MIB as usize, 9);
    server.target.fill(&data);
    let image = keys.path().join("image.raw");
    std::fs::write(&image, &data).unwrap();
    let object = format!(
        "tls-creds-x509,id=tls0,dir={},endpoint=client",
        certs.display()
    );
    let nbd = format!(
        "driver=nbd,path={},tls-creds=tls0,tls-hostname=localhost",
        server.socket.display()
    );
    run(Command::new(qemu_img)
        .args(["compare", "--object", &object, "--image-opts"])
        .arg(format!("driver=raw,file.filename={}", image.display()))
        .arg(nbd));
}

/// `openssl ARGS` in `dir`, which must succeed.
fn openssl_in(dir: &Path, args: &[&str]) {
    let openssl = require("openssl", "openssl");
    run(Command::new(openssl).args(args).current_dir(dir));
}

/// A CA and certificates it signs, in `dir`: the server's (for localhost)
/// and a client's; plus a self-signed client certificate.
fn mutual_certificates(dir: &Path) {
    let key = |name: &str| format!("{name}-key.pem");
    openssl_in(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=test CA",
            "-keyout",
            "ca-key.pem",
            "-out",
            "ca-cert.pem",
        ],
    );
    for (name, cn) in [("server", "localhost"), ("client", "client")] {
        openssl_in(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                &format!("/CN={cn}"),
                "-keyout",
                &key(name),
                "-out",
                &format!("{name}.csr"),
            ],
        );
        std::fs::write(
            dir.join(format!("{name}.ext")),
            format!("subjectAltName=DNS:{cn}\n"),
        )
        .unwrap();
        openssl_in(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca-cert.pem",
                "-CAkey",
                "ca-key.pem",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}-cert.pem"),
            ],
        );
    }
    openssl_in(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=client",
            "-keyout",
            "selfsigned-key.pem",
            "-out",
            "selfsigned-cert.pem",
        ],
    );
}

/// A libnbd client's certificate directory: the CA, and a client identity.
fn client_dir(root: &Path, name: &str, identity: Option<&str>) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(root.join("ca-cert.pem"), dir.join("ca-cert.pem")).unwrap();
    if let Some(id) = identity {
        std::fs::copy(
            root.join(format!("{id}-cert.pem")),
            dir.join("client-cert.pem"),
        )
        .unwrap();
        std::fs::copy(
            root.join(format!("{id}-key.pem")),
            dir.join("client-key.pem"),
        )
        .unwrap();
    }
    dir
}

/// Mutual TLS (`--tls-verify-peer --tls-ca`): nbdinfo with a client
/// certificate the CA signed is served; with a self-signed one, or none,
/// it is refused in the TLS handshake and never sees the export list.
#[test]
fn mutual_tls_refuses_clients_the_ca_did_not_sign_before_the_export_list() {
    let nbdinfo = require("nbdinfo", "libnbd-bin");
    let keys = tempfile::tempdir().unwrap();
    let k = keys.path();
    mutual_certificates(k);
    let server = TestServer::start_with(MemTarget::new(16 * MIB, 512), |o| {
        o.tls = TlsMode::Require;
        o.tls_files = Some(TlsFiles {
            cert: k.join("server-cert.pem"),
            key: k.join("server-key.pem"),
            client_ca: Some(k.join("ca-cert.pem")),
        });
    });
    let uri = |dir: &Path| {
        format!(
            "nbds+unix:///?socket={}&tls-certificates={}&tls-hostname=localhost",
            server.socket.display(),
            dir.display()
        )
    };
    let good = client_dir(k, "good", Some("client"));
    let output = run(Command::new(&nbdinfo)
        .arg("--json")
        .arg("--list")
        .arg(uri(&good)));
    let info: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(info["exports"][0]["export-size"], 16 * MIB);
    for (name, identity) in [("selfsigned", Some("selfsigned")), ("anonymous", None)] {
        let dir = client_dir(k, name, identity);
        let out = Command::new(&nbdinfo)
            .arg("--json")
            .arg("--list")
            .arg(uri(&dir))
            .output()
            .unwrap();
        assert!(!out.status.success(), "{name} client was served");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("16777216"),
            "{name} client saw the export list"
        );
    }
}
