//! Shared helpers: start a server on a temporary Unix socket over a
//! memory target, find required tools, capture log lines.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use nvraid_io::queue::Target;
use nvraid_serve::{ListenAddress, ServeOptions, ShutdownHandle};
use nvraid_testing::MemTarget;

/// A running test server.
pub struct TestServer {
    pub socket: PathBuf,
    pub control: PathBuf,
    pub target: Arc<MemTarget>,
    pub logs: Arc<Mutex<Vec<String>>>,
    pub shutdown: ShutdownHandle,
    pub info: nvraid_serve::ServerInfo,
    thread: Option<JoinHandle<Result<(), nvraid_serve::Error>>>,
    pub dir: tempfile::TempDir,
}

pub fn options(dir: &Path, logs: &Arc<Mutex<Vec<String>>>) -> ServeOptions {
    let sink = Arc::clone(logs);
    ServeOptions {
        listen: vec![ListenAddress::Unix(dir.join("nbd.sock"))],
        control_socket: Some(dir.join("nbd.ctl")),
        log: Arc::new(move |line: &str| sink.lock().unwrap().push(line.to_string())),
        workers: 2,
        ..ServeOptions::default()
    }
}

impl TestServer {
    pub fn start(target: Arc<MemTarget>) -> TestServer {
        TestServer::start_with(target, |_| {})
    }

    pub fn start_with(
        target: Arc<MemTarget>,
        adjust: impl FnOnce(&mut ServeOptions),
    ) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        TestServer::start_in(dir, target, adjust)
    }

    pub fn start_in(
        dir: tempfile::TempDir,
        target: Arc<MemTarget>,
        adjust: impl FnOnce(&mut ServeOptions),
    ) -> TestServer {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let mut opts = options(dir.path(), &logs);
        adjust(&mut opts);
        let shutdown = ShutdownHandle::new();
        let dyn_target: Arc<dyn Target> = target.clone();
        let server =
            nvraid_serve::start(dyn_target, opts, shutdown.clone()).expect("server starts");
        let info = server.info();
        let thread = std::thread::spawn(move || server.wait());
        TestServer {
            socket: dir.path().join("nbd.sock"),
            control: dir.path().join("nbd.ctl"),
            target,
            logs,
            shutdown,
            info,
            thread: Some(thread),
            dir,
        }
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    /// Stop the server and wait; returns the temp dir for a restart.
    pub fn stop(mut self) -> tempfile::TempDir {
        self.shutdown.trigger();
        self.thread
            .take()
            .unwrap()
            .join()
            .unwrap()
            .expect("clean shutdown");
        let dir = tempfile::tempdir().unwrap();
        std::mem::replace(&mut self.dir, dir)
    }

    pub fn log_lines(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    /// Wait (bounded) for a log line containing all `parts`.
    pub fn wait_log(&self, parts: &[&str]) -> String {
        for _ in 0..200 {
            if let Some(line) = self
                .log_lines()
                .into_iter()
                .find(|l| parts.iter().all(|p| l.contains(p)))
            {
                return line;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        panic!(
            "no log line with {parts:?}; log:\n{}",
            self.log_lines().join("\n")
        );
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.shutdown.trigger();
            let _ = thread.join();
        }
    }
}

/// The path of a tool the test needs; panics (fails the test) if missing.
pub fn require(tool: &str, package: &str) -> PathBuf {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|dir| dir.join(tool))
        .find(|path| path.is_file());
    found.unwrap_or_else(|| {
        panic!("required tool `{tool}` is missing: apt-get install -y {package}")
    })
}

/// Run a command, panicking with its output if it fails.
pub fn run(command: &mut Command) -> Output {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    if !output.status.success() {
        panic!(
            "{command:?} failed ({}):\nstdout: {}\nstderr: {}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    output
}

/// Deterministic pseudo-random bytes (xorshift).
pub fn random_bytes(length: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let mut out = Vec::with_capacity(length);
    while out.len() < length {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(length);
    out
}

pub fn sha256_file(path: &Path) -> String {
    let output = run(Command::new("sha256sum").arg(path));
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}
