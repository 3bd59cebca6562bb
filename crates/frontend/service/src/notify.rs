//! systemd's readiness protocol: a datagram of `KEY=VALUE` lines to the
//! Unix socket `NOTIFY_SOCKET` names (a path, or an abstract name written
//! with a leading `@`). Without `NOTIFY_SOCKET` (not started by systemd as
//! `Type=notify`) nothing is sent.

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Send `state` (e.g. `"READY=1\nSTATUS=serving /dev/ublkb0"`) to
/// `NOTIFY_SOCKET`. `Ok(false)`: no socket to tell.
pub fn notify(state: &str) -> io::Result<bool> {
    match std::env::var("NOTIFY_SOCKET") {
        Ok(socket) if !socket.is_empty() => notify_to(&socket, state).map(|()| true),
        _ => Ok(false),
    }
}

/// Send `state` to the socket `socket` names (`@name`: abstract).
pub fn notify_to(socket: &str, state: &str) -> io::Result<()> {
    let address = match socket.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name.as_bytes())?
        }
        None => SocketAddr::from_pathname(socket)?,
    };
    let sender = UnixDatagram::unbound()?;
    let sent = sender.send_to_addr(state.as_bytes(), &address)?;
    if sent != state.len() {
        return Err(io::Error::other(format!(
            "NOTIFY_SOCKET {socket}: {sent} of {} bytes sent",
            state.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receive(socket: &UnixDatagram) -> String {
        let mut buffer = [0u8; 512];
        let n = socket.recv(&mut buffer).unwrap();
        String::from_utf8(buffer[..n].to_vec()).unwrap()
    }

    #[test]
    fn a_path_socket_gets_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let socket = UnixDatagram::bind(&path).unwrap();
        notify_to(path.to_str().unwrap(), "READY=1\nSTATUS=serving").unwrap();
        assert_eq!(receive(&socket), "READY=1\nSTATUS=serving");
    }

    #[test]
    fn an_abstract_socket_is_written_with_an_at_sign() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("nvraid-notify-test-{}", std::process::id());
        let address = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let socket = UnixDatagram::bind_addr(&address).unwrap();
        notify_to(&format!("@{name}"), "STOPPING=1").unwrap();
        assert_eq!(receive(&socket), "STOPPING=1");
    }

    #[test]
    fn a_missing_socket_is_an_error() {
        assert!(notify_to("/nonexistent/nvraid-notify", "READY=1").is_err());
    }
}
