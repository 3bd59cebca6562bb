//! The byte channel of one connection: plaintext, or TLS (rustls) after
//! STARTTLS. For the transmission phase a channel splits into a read half
//! (the connection thread) and a write half (shared, under the
//! connection's reply lock, by whoever sends a reply).
//!
//! TLS split: one `ServerConnection` behind a mutex. The reader reads
//! ciphertext from the socket without the lock, then feeds it in under the
//! lock. Anyone sending ciphertext holds `send` (which owns the socket's
//! write side) before taking the connection lock, so records reach the
//! socket in the order rustls produced them.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::sync::{Arc, Mutex};

use rustls::ServerConnection;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::stream::Stream;
use crate::Error;

/// Load a certificate chain and key (and, for mutual TLS, the CA client
/// certificates are checked against) into a rustls server config.
pub(crate) fn tls_config(
    files: &crate::options::TlsFiles,
) -> Result<Arc<rustls::ServerConfig>, Error> {
    let (cert, key) = (files.cert.as_path(), files.key.as_path());
    let fail = |what: &str, e: &dyn std::fmt::Display| Error::Tls(format!("{what}: {e}"));
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| fail(&cert.display().to_string(), &e))?
        .collect::<Result<_, _>>()
        .map_err(|e| fail(&cert.display().to_string(), &e))?;
    if certs.is_empty() {
        return Err(Error::Tls(format!("{}: no certificate", cert.display())));
    }
    let key_name = key.display().to_string();
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| fail(&key_name, &e))?;
    let rsa_bits = rsa_modulus_bits(key.secret_der());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| fail("protocol versions", &e))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let name = ca.display().to_string();
            let mut roots = rustls::RootCertStore::empty();
            let cas: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca)
                .map_err(|e| fail(&name, &e))?
                .collect::<Result<_, _>>()
                .map_err(|e| fail(&name, &e))?;
            if cas.is_empty() {
                return Err(Error::Tls(format!("{name}: no certificate")));
            }
            for c in cas {
                roots.add(c).map_err(|e| fail(&name, &e))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| fail(&name, &e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    builder
        .with_single_cert(certs, key)
        .map(Arc::new)
        .map_err(|e| match e {
            rustls::Error::General(ref m) if m.contains("failed to parse private key") => {
                Error::Tls(format!(
                    "{key_name}: {}",
                    unsupported_key_reason(rsa_bits, m)
                ))
            }
            e => fail("certificate/key", &e),
        })
}

/// Why a private key was refused, in words a user can act on.
fn unsupported_key_reason(rsa_bits: Option<u32>, message: &str) -> String {
    match rsa_bits {
        Some(bits) if bits % 512 != 0 => format!(
            "an RSA key of {bits} bits: the TLS library of this build (rustls with ring) loads \
             RSA private keys whose modulus is a multiple of 512 bits (2048, 2560, 3072, 4096, \
             ...), where OpenSSL-based servers load any size; issue a key of such a size, or an \
             ECDSA or Ed25519 key"
        ),
        _ => message.to_string(),
    }
}

/// The modulus length in bits of an RSA private key in PKCS#8 or PKCS#1
/// DER; None for other keys or anything unexpected.
fn rsa_modulus_bits(der: &[u8]) -> Option<u32> {
    /// One DER element: (tag, contents, rest).
    fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, rest) = input.split_first()?;
        let (&first, rest) = rest.split_first()?;
        let (len, rest) = if first < 0x80 {
            (usize::from(first), rest)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 || rest.len() < n {
                return None;
            }
            let len = rest[..n]
                .iter()
                .fold(0usize, |a, &b| (a << 8) | usize::from(b));
            (len, &rest[n..])
        };
        (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
    }
    fn integer_bits(bytes: &[u8]) -> Option<u32> {
        let bytes = match bytes.iter().position(|&b| b != 0) {
            Some(i) => &bytes[i..],
            None => return None,
        };
        Some(bytes.len() as u32 * 8 - bytes[0].leading_zeros())
    }
    const SEQUENCE: u8 = 0x30;
    const INTEGER: u8 = 0x02;
    const OCTETS: u8 = 0x04;
    // rsaEncryption, 1.2.840.113549.1.1.1
    const RSA_OID: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
    let (tag, body, _) = tlv(der)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, _version, rest) = tlv(body)?;
    if tag != INTEGER {
        return None;
    }
    let (tag, second, rest) = tlv(rest)?;
    match tag {
        // PKCS#1 RSAPrivateKey: version, modulus, ...
        INTEGER => integer_bits(second),
        // PKCS#8: version, AlgorithmIdentifier, OCTET STRING (PKCS#1 key).
        SEQUENCE => {
            let (_, oid, _) = tlv(second)?;
            if oid != RSA_OID {
                return None;
            }
            let (tag, inner, _) = tlv(rest)?;
            if tag != OCTETS {
                return None;
            }
            rsa_modulus_bits(inner)
        }
        _ => None,
    }
}

/// A connection's channel before it is split.
pub(crate) enum Channel {
    Plain(Stream),
    Tls(Box<ServerConnection>, Stream),
}

impl Channel {
    /// Run the TLS handshake over a plaintext channel.
    pub(crate) fn start_tls(self, config: &Arc<rustls::ServerConfig>) -> io::Result<Channel> {
        let Channel::Plain(mut stream) = self else {
            return Err(io::Error::other("TLS already running"));
        };
        let mut tls = ServerConnection::new(Arc::clone(config)).map_err(io::Error::other)?;
        while tls.is_handshaking() {
            tls.complete_io(&mut stream)?;
        }
        Ok(Channel::Tls(Box::new(tls), stream))
    }

    pub(crate) fn stream(&self) -> &Stream {
        match self {
            Channel::Plain(s) | Channel::Tls(_, s) => s,
        }
    }

    /// Split into halves for the transmission phase.
    pub(crate) fn split(self) -> io::Result<(Box<dyn Read + Send>, Box<dyn Write + Send>)> {
        match self {
            Channel::Plain(stream) => {
                let writer = stream.try_clone()?;
                // Buffered: one read takes in many small requests (a large
                // payload is still read straight into its buffer).
                let reader = io::BufReader::with_capacity(64 * 1024, stream);
                Ok((Box::new(reader), Box::new(writer)))
            }
            Channel::Tls(tls, stream) => {
                let shared = Arc::new(TlsShared {
                    tls: Mutex::new(*tls),
                    send: Mutex::new(stream.try_clone()?),
                });
                let reader = TlsReader {
                    shared: Arc::clone(&shared),
                    socket: stream,
                    scratch: vec![0; 64 * 1024],
                    start: 0,
                    end: 0,
                };
                Ok((Box::new(reader), Box::new(TlsWriter { shared })))
            }
        }
    }
}

impl Read for Channel {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Channel::Plain(s) => s.read(buf),
            Channel::Tls(tls, s) => rustls::Stream::new(tls.as_mut(), s).read(buf),
        }
    }
}

impl Write for Channel {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Channel::Plain(s) => s.write(buf),
            Channel::Tls(tls, s) => rustls::Stream::new(tls.as_mut(), s).write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Channel::Plain(s) => s.flush(),
            Channel::Tls(tls, s) => rustls::Stream::new(tls.as_mut(), s).flush(),
        }
    }
}

struct TlsShared {
    tls: Mutex<ServerConnection>,
    /// The socket's write side; held while ciphertext is produced and sent.
    send: Mutex<Stream>,
}

impl TlsShared {
    /// Send whatever ciphertext rustls has queued.
    fn send_pending(&self) -> io::Result<()> {
        let mut socket = self.send.lock().expect("tls send lock");
        let mut ciphertext = Vec::new();
        {
            let mut tls = self.tls.lock().expect("tls lock");
            while tls.wants_write() {
                tls.write_tls(&mut ciphertext)?;
            }
        }
        socket.write_all(&ciphertext)
    }
}

struct TlsReader {
    shared: Arc<TlsShared>,
    socket: Stream,
    /// Ciphertext read from the socket, `start..end` not yet given to rustls.
    scratch: Vec<u8>,
    start: usize,
    end: usize,
}

impl Read for TlsReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            {
                let mut tls = self.shared.tls.lock().expect("tls lock");
                match tls.reader().read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            if self.start == self.end {
                let n = self.socket.read(&mut self.scratch)?;
                if n == 0 {
                    return Ok(0);
                }
                (self.start, self.end) = (0, n);
            }
            // Feed one record batch at a time: rustls refuses ciphertext
            // while its plaintext buffer is full, and plaintext is drained
            // at the top of the loop before more is fed.
            let wants_write = {
                let mut tls = self.shared.tls.lock().expect("tls lock");
                let mut input = &self.scratch[self.start..self.end];
                let used = tls.read_tls(&mut input)?;
                self.start += used;
                tls.process_new_packets()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                tls.wants_write()
            };
            if wants_write {
                self.shared.send_pending()?;
            }
        }
    }
}

struct TlsWriter {
    shared: Arc<TlsShared>,
}

impl Write for TlsWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            let written = self
                .shared
                .tls
                .lock()
                .expect("tls lock")
                .writer()
                .write(buf)?;
            self.shared.send_pending()?;
            if written > 0 || buf.is_empty() {
                return Ok(written);
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.shared.send_pending()
    }
}

impl Drop for TlsWriter {
    fn drop(&mut self) {
        if let Ok(mut tls) = self.shared.tls.lock() {
            tls.send_close_notify();
        }
        let _ = self.shared.send_pending();
        if let Ok(socket) = self.shared.send.lock() {
            socket.shutdown(Shutdown::Write);
        }
    }
}
