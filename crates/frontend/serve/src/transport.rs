//! The byte channel of one connection during its handshake: plaintext, or
//! TLS (rustls) after STARTTLS, blocking, on the connection's thread. For
//! the transmission phase it becomes a worker's non-blocking `Wire`.

use std::io::{self, Read, Write};
use std::sync::Arc;

use rustls::ServerConnection;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::Error;
use crate::stream::Stream;

/// The most read from a PEM file named on the command line (a CA bundle
/// of every public root is well under 1 MiB).
pub(crate) const PEM_MAX_BYTES: u64 = 4 << 20;

/// The PEM bytes of `path`, read with a bound; errors name the file.
fn read_pem(path: &std::path::Path) -> Result<Vec<u8>, Error> {
    nvraid_io::bounded::read_file(path, PEM_MAX_BYTES, "a PEM file")
        .map_err(|e| Error::Tls(format!("{}: {e}", path.display())))
}

/// The certificates in the PEM file `path` (at least one).
fn read_certificates(path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let pem = read_pem(path)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| Error::Tls(format!("{}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(Error::Tls(format!("{}: no certificate", path.display())));
    }
    Ok(certs)
}

/// Load a certificate chain and key (and, for mutual TLS, the CA client
/// certificates are checked against) into a rustls server config. Each
/// file is read with a bound ([`PEM_MAX_BYTES`]).
pub(crate) fn tls_config(
    files: &crate::options::TlsFiles,
) -> Result<Arc<rustls::ServerConfig>, Error> {
    let (cert, key) = (files.cert.as_path(), files.key.as_path());
    let fail = |what: &str, e: &dyn std::fmt::Display| Error::Tls(format!("{what}: {e}"));
    let certs = read_certificates(cert)?;
    let key_name = key.display().to_string();
    let key = PrivateKeyDer::from_pem_slice(&read_pem(key)?).map_err(|e| fail(&key_name, &e))?;
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
            for c in read_certificates(ca)? {
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
