//! nbdkit, the NBD server tests put behind members: started on a unix
//! socket with the plugin and filters a test gives, waited for until it
//! takes a connection, and killed when dropped (a failing test leaves no server
//! behind). Needs nbdkit (`./test.sh` installs it).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running nbdkit.
pub struct Nbdkit {
    child: Child,
    socket: PathBuf,
}

impl Nbdkit {
    /// `nbdkit -f -U SOCKET ARGS...` (a stale socket file is removed
    /// first); returns once it takes connections.
    pub fn start<I, S>(socket: &Path, args: I) -> Nbdkit
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let _ = std::fs::remove_file(socket);
        let child = Command::new("nbdkit")
            .arg("-f")
            .arg("-U")
            .arg(socket)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nbdkit is installed (./test.sh installs it)");
        // The socket file appears when nbdkit binds it, a moment before
        // it listens: a connection in between is refused. Ready means a
        // connection is taken (the probe is closed at once).
        let started = Instant::now();
        while std::os::unix::net::UnixStream::connect(socket).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "nbdkit did not start on {}",
                socket.display()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        Nbdkit {
            child,
            socket: socket.to_path_buf(),
        }
    }

    /// The export's URI, as members are named.
    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    /// Kill the server now (as dropping it does).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Nbdkit {
    fn drop(&mut self) {
        self.stop();
    }
}
