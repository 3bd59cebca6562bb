//! TLS for NBD members (`nbds://`): one client configuration per process,
//! built from the command line's `--tls-ca` (the CA that signed the
//! servers' certificates) and, for servers that check their clients,
//! `--tls-cert`/`--tls-key`.

use crate::uri::{Address, NbdUri};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::path::Path;
use std::sync::{Arc, RwLock};

static CLIENT: RwLock<Option<Arc<rustls::ClientConfig>>> = RwLock::new(None);

/// Build and install the process's TLS client configuration.
pub fn configure(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<(), String> {
    let config = build(ca, identity)?;
    *CLIENT.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(config));
    Ok(())
}

pub(crate) fn client_config() -> Option<Arc<rustls::ClientConfig>> {
    CLIENT.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The most read from a PEM file named on the command line.
const PEM_MAX_BYTES: u64 = 4 << 20;

fn read_pem(path: &Path) -> Result<Vec<u8>, String> {
    nvraid_io::bounded::read_file(path, PEM_MAX_BYTES, "a PEM file")
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    CertificateDer::pem_slice_iter(&read_pem(path)?)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: cannot read certificates: {e}", path.display()))
}

fn build(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    let certs = certificates(ca)?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in the file", ca.display()));
    }
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| format!("{}: {e}", ca.display()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    match identity {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain = certificates(cert)?;
            let key = PrivateKeyDer::from_pem_slice(&read_pem(key)?)
                .map_err(|e| format!("{}: cannot read the private key: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("{}: {e}", cert.display()))
        }
    }
}

/// The name the server's certificate must carry: `tls-hostname=` from the
/// URI, else the host (an IP address is checked as one), else `localhost`
/// for unix sockets.
pub(crate) fn server_name(uri: &NbdUri) -> Result<ServerName<'static>, String> {
    let name = match (&uri.tls_hostname, &uri.address) {
        (Some(name), _) => name.clone(),
        (None, Address::Tcp { host, .. }) => host.clone(),
        (None, Address::Unix(_)) => "localhost".to_string(),
    };
    ServerName::try_from(name.clone()).map_err(|e| format!("{name:?} is not a host name: {e}"))
}
