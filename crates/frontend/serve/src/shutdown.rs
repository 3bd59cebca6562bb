//! Stopping the server from another thread (a signal handler thread, a
//! test): stop accepting, let in-flight requests finish, flush, return.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// A cloneable trigger; `serve` returns after it fires.
#[derive(Clone, Debug, Default)]
pub struct ShutdownHandle {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    requested: AtomicBool,
    lock: Mutex<()>,
    changed: Condvar,
}

impl ShutdownHandle {
    pub fn new() -> ShutdownHandle {
        ShutdownHandle::default()
    }

    /// Ask the server to stop. Safe to call more than once.
    pub fn trigger(&self) {
        self.inner.requested.store(true, Ordering::SeqCst);
        let _guard = self.inner.lock.lock().expect("shutdown lock");
        self.inner.changed.notify_all();
    }

    pub fn is_triggered(&self) -> bool {
        self.inner.requested.load(Ordering::SeqCst)
    }

    /// Wait up to `timeout`; true when triggered.
    pub fn wait_timeout(&self, timeout: std::time::Duration) -> bool {
        let guard = self.inner.lock.lock().expect("shutdown lock");
        let _unused = self
            .inner
            .changed
            .wait_timeout_while(guard, timeout, |_| !self.is_triggered())
            .expect("shutdown lock");
        self.is_triggered()
    }

    /// Block until triggered.
    pub fn wait(&self) {
        let mut guard = self.inner.lock.lock().expect("shutdown lock");
        while !self.is_triggered() {
            guard = self.inner.changed.wait(guard).expect("shutdown lock");
        }
    }
}
