//! NBD members over TLS against nbdkit (GnuTLS): the client verifies the
//! server's certificate against `--nbd-tls-ca`, refuses one signed by
//! another CA, and presents its own certificate to a server that checks
//! its clients (`--tls-verify-peer`). One test: the TLS configuration is
//! process-wide.

mod common;

use common::plain_op;
use nvraid_io::engine::MemberOpKind;
use nvraid_io::remote::RemoteFile;
use nvraid_remote::{RemoteExport, RemoteOptions};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn openssl(args: &[&str], dir: &Path) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (./test.sh installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA in `dir` (ca-cert.pem, ca-key.pem) and a certificate it signs for
/// `cn` (NAME-cert.pem, NAME-key.pem).
fn ca(dir: &Path) {
    openssl(
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=nvraid test CA",
            "-keyout",
            "ca-key.pem",
            "-out",
            "ca-cert.pem",
        ],
        dir,
    );
}

fn signed(dir: &Path, name: &str, cn: &str) {
    openssl(
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={cn}"),
            "-keyout",
            &format!("{name}-key.pem"),
            "-out",
            &format!("{name}.csr"),
        ],
        dir,
    );
    let ext = dir.join(format!("{name}.ext"));
    std::fs::write(&ext, format!("subjectAltName=DNS:{cn}\n")).unwrap();
    openssl(
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
        dir,
    );
}

struct Nbdkit(Child, std::path::PathBuf);

impl Nbdkit {
    fn tls(certs: &Path, socket: &Path, verify_peer: bool) -> Nbdkit {
        let mut cmd = Command::new("nbdkit");
        cmd.arg("-f")
            .arg("-U")
            .arg(socket)
            .arg("--tls=require")
            .arg(format!("--tls-certificates={}", certs.display()));
        if verify_peer {
            cmd.arg("--tls-verify-peer");
        }
        let child = cmd
            .args(["memory", "size=16M"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nbdkit");
        let start = Instant::now();
        // Ready when it takes a connection: the socket file appears a
        // moment before nbdkit listens on it.
        while std::os::unix::net::UnixStream::connect(socket).is_err() {
            assert!(start.elapsed() < Duration::from_secs(20));
            std::thread::sleep(Duration::from_millis(20));
        }
        Nbdkit(child, socket.to_path_buf())
    }

    fn uri(&self) -> String {
        format!(
            "nbds+unix:///?socket={}&tls-hostname=localhost",
            self.1.display()
        )
    }
}

impl Drop for Nbdkit {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn options() -> RemoteOptions {
    RemoteOptions {
        request_timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(5),
    }
}

#[test]
fn tls_members_verify_the_server_and_present_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // nbdkit's layout: ca-cert.pem, server-cert.pem, server-key.pem.
    let certs = d.join("server");
    std::fs::create_dir(&certs).unwrap();
    ca(&certs);
    signed(&certs, "server", "localhost");
    signed(&certs, "client", "nvraid-client");
    let other = d.join("other");
    std::fs::create_dir(&other).unwrap();
    ca(&other);

    let server = Nbdkit::tls(&certs, &d.join("a.sock"), false);

    // No CA configured: a clear refusal.
    let err = RemoteExport::open(&server.uri(), true, false, options()).unwrap_err();
    assert!(err.to_string().contains("--nbd-tls-ca"), "{err}");

    // A CA that did not sign the server's certificate.
    nvraid_remote::tls::configure(&other.join("ca-cert.pem"), None).unwrap();
    let err = RemoteExport::open(&server.uri(), true, false, options()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with(&server.uri()) && text.contains("TLS") && text.contains("certificate"),
        "{text}"
    );

    // The right CA: the simple path and a pipelined channel both work.
    nvraid_remote::tls::configure(&certs.join("ca-cert.pem"), None).unwrap();
    let export = RemoteExport::open(&server.uri(), true, false, options()).unwrap();
    let data: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
    export.write_at(&data, 65536).unwrap();
    let mut back = vec![0u8; data.len()];
    export.read_at(&mut back, 65536).unwrap();
    assert!(back == data, "bytes differ over TLS");
    let mut channel = export.open_channel().unwrap();
    let mut bufs: Vec<Vec<u8>> = (0..32).map(|_| vec![0u8; 65536]).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        let offset = 65536 + (i as u64) * 65536;
        let op = plain_op(MemberOpKind::Read, offset, b.as_mut_ptr(), 65536, i as u64);
        unsafe { channel.push(&op) }.unwrap();
    }
    let start = Instant::now();
    let mut done = 0;
    while channel.inflight() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "reads never completed"
        );
        done += channel.progress(&mut |_, r| assert_eq!(r, 65536));
        nvraid_io::remote::wait_for(
            std::iter::once(channel.as_ref()),
            Some(Duration::from_millis(10)),
        );
    }
    assert_eq!(done, 32);
    for (i, b) in bufs.iter().enumerate() {
        assert!(
            b[..] == data[i * 65536..(i + 1) * 65536],
            "read {i} differs"
        );
    }
    drop(channel);
    drop(export);

    // A server that checks its clients: refused without a certificate,
    // served with one the CA signed.
    let strict = Nbdkit::tls(&certs, &d.join("b.sock"), true);
    let err = RemoteExport::open(&strict.uri(), true, false, options()).unwrap_err();
    assert!(err.to_string().contains(&strict.uri()), "{err}");
    nvraid_remote::tls::configure(
        &certs.join("ca-cert.pem"),
        Some((
            &certs.join("client-cert.pem"),
            &certs.join("client-key.pem"),
        )),
    )
    .unwrap();
    let export = RemoteExport::open(&strict.uri(), true, false, options()).unwrap();
    export.write_at(&data[..4096], 0).unwrap();
    let mut small = vec![0u8; 4096];
    export.read_at(&mut small, 0).unwrap();
    assert_eq!(small, data[..4096]);
}
