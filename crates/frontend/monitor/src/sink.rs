//! Where events go: the log (journald's native protocol, or a key=value
//! line on standard error), the alert program (mdadm's `PROGRAM`
//! convention) and mail through the local MTA.
//!
//! The log line is written at once, by the thread that found the event.
//! The program and the mail are delivered by a thread of their own
//! ([`Delivery`]) from a bounded queue, so that neither a slow program nor
//! a full queue ever holds the array up: a program that hangs is killed at
//! its time limit, one that fails or is missing is retried with backoff
//! (each failure logged), and an event the full queue cannot take is
//! logged as not delivered. Nothing is dropped without a log line.

use std::collections::VecDeque;
use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::event::Event;

/// journald's socket for the native protocol.
pub const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";
/// Environment variable that points the log at another socket (tests).
pub const JOURNAL_SOCKET_ENV: &str = "NVRAID_JOURNAL_SOCKET";
/// Once the server stops, a program (or sendmail) still running gets at
/// most this much longer, whatever its time limit: a hung one does not
/// hold the stop for `--alert-timeout`.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// The MTA's sendmail interface.
pub const SENDMAIL: &str = "/usr/sbin/sendmail";
/// Environment variable naming another sendmail (tests).
pub const SENDMAIL_ENV: &str = "NVRAID_SENDMAIL";

/// The array an event is about.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArrayId {
    pub name: String,
    pub uuid: String,
}

/// The log: journald when its socket is there, standard error otherwise.
#[derive(Clone, Debug)]
pub struct Journal {
    socket: PathBuf,
}

impl Journal {
    pub fn new(socket: impl Into<PathBuf>) -> Journal {
        Journal {
            socket: socket.into(),
        }
    }

    /// journald's socket, or the one `NVRAID_JOURNAL_SOCKET` names.
    pub fn from_env() -> Journal {
        Journal::new(
            std::env::var_os(JOURNAL_SOCKET_ENV)
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(JOURNAL_SOCKET)),
        )
    }

    /// Log `message` at syslog `priority` with nvraid's fields and `extra`
    /// (`NVRAID_EVENT`, `NVRAID_ARRAY`, ...; empty values are left out).
    pub fn log(&self, priority: u8, message: &str, extra: &[(&str, &str)]) {
        let priority = priority.min(7).to_string();
        let mut fields = vec![
            ("MESSAGE", message),
            ("PRIORITY", priority.as_str()),
            ("SYSLOG_IDENTIFIER", "nvraid"),
        ];
        fields.extend(extra.iter().filter(|(_, v)| !v.is_empty()));
        if self.send(&fields).is_err() {
            eprintln!("{}", key_value_line(&fields));
        }
    }

    /// One event's log entry.
    pub fn event(&self, array: &ArrayId, event: &Event) {
        self.log(
            event.kind.priority(),
            &event.message,
            &event_fields(array, event),
        );
    }

    fn send(&self, fields: &[(&str, &str)]) -> std::io::Result<()> {
        let socket = UnixDatagram::unbound()?;
        socket.send_to(&encode(fields), &self.socket).map(drop)
    }
}

/// The fields nvraid adds to an event's entry (and the program's
/// environment).
fn event_fields<'a>(array: &'a ArrayId, event: &'a Event) -> Vec<(&'static str, &'a str)> {
    vec![
        ("NVRAID_EVENT", event.kind.name()),
        ("NVRAID_ARRAY", array.name.as_str()),
        ("NVRAID_UUID", array.uuid.as_str()),
        ("NVRAID_MEMBER", event.member.as_deref().unwrap_or("")),
    ]
}

/// journald's native protocol: `KEY=value\n` per field; a value with a
/// newline is sent as `KEY\n`, its length as 64-bit little endian, the
/// bytes, `\n`.
pub fn encode(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, value) in fields {
        out.extend_from_slice(key.as_bytes());
        if value.contains('\n') {
            out.push(b'\n');
            out.extend_from_slice(&(value.len() as u64).to_le_bytes());
        } else {
            out.push(b'=');
        }
        out.extend_from_slice(value.as_bytes());
        out.push(b'\n');
    }
    out
}

/// The line written to standard error when journald is not there:
/// `nvraid: key=value ...`, the message last and quoted.
fn key_value_line(fields: &[(&str, &str)]) -> String {
    let mut line = String::from("nvraid:");
    let mut message = "";
    for (key, value) in fields {
        match *key {
            "MESSAGE" => message = value,
            "SYSLOG_IDENTIFIER" => {}
            _ => line.push_str(&format!(" {}={}", key.to_lowercase(), quote(value))),
        }
    }
    line.push_str(&format!(" message={}", quote(message)));
    line
}

fn quote(value: &str) -> String {
    if !value.is_empty() && !value.contains([' ', '"', '\n', '=']) {
        return value.to_string();
    }
    format!("{value:?}")
}

/// Where alerts are delivered besides the log.
#[derive(Clone, Debug)]
pub enum Alert {
    /// Run as `PROGRAM EVENT ARRAY [MEMBER]`.
    Program(PathBuf),
    /// Mail to `to` through `sendmail -t`.
    Mail { sendmail: PathBuf, to: String },
}

impl Alert {
    fn describe(&self) -> String {
        match self {
            Alert::Program(path) => format!("alert program {}", path.display()),
            Alert::Mail { to, sendmail } => {
                format!("alert mail to {to} (through {})", sendmail.display())
            }
        }
    }
}

/// How deliveries are timed.
#[derive(Clone, Copy, Debug)]
pub struct DeliveryOptions {
    /// A program (or sendmail) still running after this long is killed.
    pub timeout: Duration,
    /// The wait before the first retry; doubled after each failure up to
    /// `backoff_max`.
    pub backoff_first: Duration,
    pub backoff_max: Duration,
    /// Events waiting for the delivery thread, at most.
    pub queue: usize,
}

impl Default for DeliveryOptions {
    fn default() -> Self {
        DeliveryOptions {
            timeout: Duration::from_secs(30),
            backoff_first: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            queue: 256,
        }
    }
}

enum Message {
    Event(Event),
    Stop,
}

/// The delivery thread of the program and the mail.
pub struct Delivery {
    sender: SyncSender<Message>,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    array: ArrayId,
    journal: Journal,
}

impl Delivery {
    pub fn start(
        array: ArrayId,
        alerts: Vec<Alert>,
        options: DeliveryOptions,
        journal: Journal,
    ) -> Delivery {
        let (sender, receiver) = mpsc::sync_channel(options.queue.max(1));
        let stopping = Arc::new(AtomicBool::new(false));
        let worker = Worker {
            stopping: stopping.clone(),
            array: array.clone(),
            journal: journal.clone(),
            options,
            queues: alerts
                .into_iter()
                .map(|alert| Pending {
                    alert,
                    events: VecDeque::new(),
                    attempts: 0,
                    next: Instant::now(),
                })
                .collect(),
        };
        let thread = std::thread::Builder::new()
            .name("nvraid-alerts".into())
            .spawn(move || worker.run(receiver))
            .expect("spawn the alert thread");
        Delivery {
            sender,
            stopping,
            thread: Some(thread),
            array,
            journal,
        }
    }

    /// Hands `event` to the delivery thread without waiting; when its
    /// queue is full the event is logged as not delivered.
    pub fn send(&self, event: &Event) {
        match self.sender.try_send(Message::Event(event.clone())) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => self.journal.log(
                3,
                &format!(
                    "nvraid: ALERT NOT DELIVERED: the alert queue is full; {} on {} will \
                         reach no program or mail (this log has it)",
                    event.kind, self.array.name
                ),
                &event_fields(&self.array, event),
            ),
        }
    }

    /// Delivers what is due, logs what could not be, and ends the thread.
    pub fn stop(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.stopping.store(true, Ordering::Release);
            // A full queue cannot take the stop: wait for room.
            let _ = self.sender.send(Message::Stop);
            let _ = thread.join();
        }
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        self.finish();
    }
}

/// One alert's events not yet delivered, in order.
struct Pending {
    alert: Alert,
    events: VecDeque<Event>,
    attempts: u32,
    next: Instant,
}

struct Worker {
    stopping: Arc<AtomicBool>,
    array: ArrayId,
    journal: Journal,
    options: DeliveryOptions,
    queues: Vec<Pending>,
}

impl Worker {
    fn run(mut self, receiver: Receiver<Message>) {
        loop {
            let wait = self
                .queues
                .iter()
                .filter(|q| !q.events.is_empty())
                .map(|q| q.next.saturating_duration_since(Instant::now()))
                .min()
                .unwrap_or(Duration::from_secs(3600));
            match receiver.recv_timeout(wait) {
                Ok(Message::Event(event)) => self.queue(event),
                Ok(Message::Stop) | Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {}
            }
            self.deliver_due();
        }
        // Stopping: what came before the stop, once more for alerts not
        // in backoff; the rest is logged as not delivered.
        while let Ok(Message::Event(event)) = receiver.try_recv() {
            self.queue(event);
        }
        for q in 0..self.queues.len() {
            if self.queues[q].attempts == 0 {
                while !self.queues[q].events.is_empty() && self.attempt(q) {}
            }
            let pending = std::mem::take(&mut self.queues[q].events);
            for event in pending {
                self.journal.log(
                    3,
                    &format!(
                        "nvraid: ALERT NOT DELIVERED: {} of {} on {} was still pending when \
                         the server stopped",
                        self.queues[q].alert.describe(),
                        event.kind,
                        self.array.name
                    ),
                    &event_fields(&self.array, &event),
                );
            }
        }
    }

    fn queue(&mut self, event: Event) {
        let limit = self.options.queue.max(1);
        for q in 0..self.queues.len() {
            if self.queues[q].events.len() >= limit {
                self.journal.log(
                    3,
                    &format!(
                        "nvraid: ALERT NOT DELIVERED: {} has {limit} events waiting; {} on {} \
                         is not queued for it (this log has it)",
                        self.queues[q].alert.describe(),
                        event.kind,
                        self.array.name
                    ),
                    &event_fields(&self.array, &event),
                );
                continue;
            }
            self.queues[q].events.push_back(event.clone());
        }
    }

    /// Each alert delivers its events in order while they succeed; the
    /// first failure puts that alert into backoff.
    fn deliver_due(&mut self) {
        for q in 0..self.queues.len() {
            while !self.queues[q].events.is_empty()
                && self.queues[q].next <= Instant::now()
                && self.attempt(q)
            {}
        }
    }

    /// One attempt at the oldest event of alert `q`: true if delivered.
    fn attempt(&mut self, q: usize) -> bool {
        let Some(event) = self.queues[q].events.front().cloned() else {
            return true;
        };
        let outcome = match &self.queues[q].alert {
            Alert::Program(path) => run_program_until(
                path,
                &self.array,
                &event,
                self.options.timeout,
                Some(&self.stopping),
            ),
            Alert::Mail { sendmail, to } => send_mail_until(
                sendmail,
                to,
                &self.array,
                &event,
                self.options.timeout,
                Some(&self.stopping),
            ),
        };
        let pending = &mut self.queues[q];
        match outcome {
            Ok(()) => {
                if pending.attempts > 0 {
                    self.journal.log(
                        5,
                        &format!(
                            "nvraid: {} delivered {} on {} after {} failed attempts",
                            pending.alert.describe(),
                            event.kind,
                            self.array.name,
                            pending.attempts
                        ),
                        &event_fields(&self.array, &event),
                    );
                }
                pending.events.pop_front();
                pending.attempts = 0;
                pending.next = Instant::now();
                true
            }
            Err(why) => {
                pending.attempts += 1;
                let backoff = self
                    .options
                    .backoff_first
                    .saturating_mul(1 << (pending.attempts - 1).min(16))
                    .min(self.options.backoff_max);
                pending.next = Instant::now() + backoff;
                self.journal.log(
                    3,
                    &format!(
                        "nvraid: ALERT FAILED: {} for {} on {}: {why} (attempt {}; retrying in \
                         {:.0} s; {} events waiting)",
                        pending.alert.describe(),
                        event.kind,
                        self.array.name,
                        pending.attempts,
                        backoff.as_secs_f64(),
                        pending.events.len()
                    ),
                    &event_fields(&self.array, &event),
                );
                false
            }
        }
    }
}

/// Runs `PROGRAM EVENT ARRAY [MEMBER]` with the event in its environment,
/// in a process group of its own (killed whole at the time limit). Exit
/// status 0 is delivered.
pub fn run_program(
    program: &Path,
    array: &ArrayId,
    event: &Event,
    timeout: Duration,
) -> Result<(), String> {
    run_program_until(program, array, event, timeout, None)
}

/// [`run_program`], cut short [`STOP_GRACE`] after `stopping` is set.
fn run_program_until(
    program: &Path,
    array: &ArrayId,
    event: &Event,
    timeout: Duration,
    stopping: Option<&AtomicBool>,
) -> Result<(), String> {
    let mut command = Command::new(program);
    command.arg(event.kind.name()).arg(&array.name);
    if let Some(member) = &event.member {
        command.arg(member);
    }
    for (key, value) in event_fields(array, event) {
        command.env(key, value);
    }
    command.stdin(Stdio::null()).process_group(0);
    let child = command.spawn().map_err(|e| format!("cannot run it: {e}"))?;
    wait_for(child, timeout, stopping)
}

/// Mails the event through `sendmail -t` (the message names its
/// recipient in `To:`).
pub fn send_mail(
    sendmail: &Path,
    to: &str,
    array: &ArrayId,
    event: &Event,
    timeout: Duration,
) -> Result<(), String> {
    send_mail_until(sendmail, to, array, event, timeout, None)
}

fn send_mail_until(
    sendmail: &Path,
    to: &str,
    array: &ArrayId,
    event: &Event,
    timeout: Duration,
    stopping: Option<&AtomicBool>,
) -> Result<(), String> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let message = format!(
        "To: {to}\nSubject: nvraid: {} event on {}{}\n\
         Content-Type: text/plain; charset=utf-8\n\n\
         This is a message from nvraid{}.\n\n{}\n\nevent: {}\narray: {}\nuuid: {}\nmember: {}\n",
        event.kind,
        array.name,
        if host.is_empty() {
            String::new()
        } else {
            format!(":{host}")
        },
        if host.is_empty() {
            String::new()
        } else {
            format!(" on {host}")
        },
        event.message,
        event.kind,
        array.name,
        array.uuid,
        event.member.as_deref().unwrap_or("-"),
    );
    let mut child = Command::new(sendmail)
        .arg("-t")
        .stdin(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", sendmail.display()))?;
    // A few hundred bytes: the pipe takes them without waiting.
    let written = child
        .stdin
        .take()
        .map(|mut stdin| stdin.write_all(message.as_bytes()));
    if let Some(Err(e)) = written {
        let _ = wait_for(child, timeout, stopping);
        return Err(format!("writing the message to sendmail: {e}"));
    }
    wait_for(child, timeout, stopping)
}

/// Waits for `child` at most `timeout` (and at most [`STOP_GRACE`] once
/// `stopping` is set); past it, its process group is killed.
fn wait_for(
    mut child: std::process::Child,
    timeout: Duration,
    stopping: Option<&AtomicBool>,
) -> Result<(), String> {
    let mut deadline = Instant::now() + timeout;
    let mut cut = false;
    loop {
        if !cut && stopping.is_some_and(|s| s.load(Ordering::Acquire)) {
            cut = true;
            deadline = deadline.min(Instant::now() + STOP_GRACE);
        }
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(format!("it exited with {status}")),
            Ok(None) if Instant::now() >= deadline => {
                let _ = nvraid_io::sys::kill_process_group(child.id());
                let _ = child.kill();
                let _ = child.wait();
                return Err(if cut {
                    "it was still running when the server stopped and was killed".to_string()
                } else {
                    format!(
                        "it was still running after {:.0} s and was killed",
                        timeout.as_secs_f64()
                    )
                });
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("waiting for it: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventKind;
    use std::os::unix::fs::PermissionsExt;

    fn fail_event() -> Event {
        Event {
            kind: EventKind::Fail,
            member: Some("/tmp/m1".into()),
            message: "array a: member /tmp/m1 (role 1) marked faulty".into(),
        }
    }

    fn array() -> ArrayId {
        ArrayId {
            name: "a".into(),
            uuid: "01234567:89abcdef:01234567:89abcdef".into(),
        }
    }

    /// The datagrams a socket at `path` received, each as its fields.
    fn received(socket: &UnixDatagram) -> Vec<u8> {
        let mut buf = vec![0u8; 65536];
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let n = socket.recv(&mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    #[test]
    fn an_event_reaches_journald_with_its_fields() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.socket");
        let socket = UnixDatagram::bind(&path).unwrap();
        Journal::new(&path).event(&array(), &fail_event());
        let text = String::from_utf8(received(&socket)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for field in [
            "MESSAGE=array a: member /tmp/m1 (role 1) marked faulty",
            "PRIORITY=2",
            "SYSLOG_IDENTIFIER=nvraid",
            "NVRAID_EVENT=Fail",
            "NVRAID_ARRAY=a",
            "NVRAID_UUID=01234567:89abcdef:01234567:89abcdef",
            "NVRAID_MEMBER=/tmp/m1",
        ] {
            assert!(lines.contains(&field), "{field} missing from {text:?}");
        }
    }

    #[test]
    fn a_value_with_a_newline_is_sent_with_its_length() {
        let bytes = encode(&[("MESSAGE", "two\nlines"), ("PRIORITY", "3")]);
        let mut expected = b"MESSAGE\n".to_vec();
        expected.extend_from_slice(&9u64.to_le_bytes());
        expected.extend_from_slice(b"two\nlines\nPRIORITY=3\n");
        assert_eq!(bytes, expected);
    }

    #[test]
    fn without_journald_the_line_is_key_value() {
        let line = key_value_line(&[
            ("MESSAGE", "member m1 failed"),
            ("PRIORITY", "2"),
            ("SYSLOG_IDENTIFIER", "nvraid"),
            ("NVRAID_EVENT", "Fail"),
        ]);
        assert_eq!(
            line,
            "nvraid: priority=2 nvraid_event=Fail message=\"member m1 failed\""
        );
        // And the journal falls back to it (no panic, no error) when the
        // socket is not there.
        Journal::new("/nonexistent/socket").log(5, "x", &[]);
    }

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn the_program_gets_the_event_as_arguments_and_environment() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let program = script(
            dir.path(),
            "alert",
            &format!(
                "echo \"$@|$NVRAID_EVENT|$NVRAID_ARRAY|$NVRAID_UUID|$NVRAID_MEMBER\" >> {}",
                out.display()
            ),
        );
        run_program(&program, &array(), &fail_event(), Duration::from_secs(10)).unwrap();
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            "Fail a /tmp/m1|Fail|a|01234567:89abcdef:01234567:89abcdef|/tmp/m1\n"
        );
    }

    #[test]
    fn a_hung_program_is_killed_at_its_time_limit() {
        let dir = tempfile::tempdir().unwrap();
        let program = script(dir.path(), "hang", "sleep 1000");
        let started = Instant::now();
        let e = run_program(
            &program,
            &array(),
            &fail_event(),
            Duration::from_millis(300),
        )
        .unwrap_err();
        assert!(e.contains("killed"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let e = run_program(
            &dir.path().join("absent"),
            &array(),
            &fail_event(),
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(e.contains("cannot run"), "{e}");
    }

    #[test]
    fn a_hung_program_does_not_hold_the_stop_for_its_time_limit() {
        let dir = tempfile::tempdir().unwrap();
        let program = script(dir.path(), "hang", "sleep 1000");
        let journal_path = dir.path().join("journal.socket");
        let journal = UnixDatagram::bind(&journal_path).unwrap();
        let delivery = Delivery::start(
            array(),
            vec![Alert::Program(program)],
            DeliveryOptions {
                timeout: Duration::from_secs(60),
                ..DeliveryOptions::default()
            },
            Journal::new(&journal_path),
        );
        delivery.send(&fail_event());
        std::thread::sleep(Duration::from_millis(300));
        let started = Instant::now();
        delivery.stop();
        let took = started.elapsed();
        assert!(took < STOP_GRACE + Duration::from_secs(2), "{took:?}");
        let mut logged = String::new();
        while !logged.contains("ALERT NOT DELIVERED") {
            logged.push_str(&String::from_utf8(received(&journal)).unwrap());
        }
        assert!(
            logged.contains("when the server stopped and was killed"),
            "{logged}"
        );
    }

    #[test]
    fn mail_goes_through_sendmail_t() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("mail");
        let sendmail = script(
            dir.path(),
            "sendmail",
            &format!("echo \"args: $@\" > {0}; cat >> {0}", out.display()),
        );
        send_mail(
            &sendmail,
            "root@example.org",
            &array(),
            &fail_event(),
            Duration::from_secs(10),
        )
        .unwrap();
        let mail = std::fs::read_to_string(&out).unwrap();
        assert!(
            mail.starts_with("args: -t\nTo: root@example.org\n"),
            "{mail}"
        );
        assert!(mail.contains("Subject: nvraid: Fail event on a"), "{mail}");
        assert!(mail.contains("member: /tmp/m1"), "{mail}");
    }

    #[test]
    fn a_failing_program_is_retried_until_it_works_and_nothing_is_lost() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let flag = dir.path().join("ok");
        let program = script(
            dir.path(),
            "flaky",
            &format!(
                "test -e {} || exit 1\necho \"$1 $3\" >> {}",
                flag.display(),
                out.display()
            ),
        );
        let journal_path = dir.path().join("journal.socket");
        let journal = UnixDatagram::bind(&journal_path).unwrap();
        let delivery = Delivery::start(
            array(),
            vec![Alert::Program(program)],
            DeliveryOptions {
                backoff_first: Duration::from_millis(50),
                backoff_max: Duration::from_millis(200),
                ..DeliveryOptions::default()
            },
            Journal::new(&journal_path),
        );
        delivery.send(&fail_event());
        let mut second = fail_event();
        second.kind = EventKind::DegradedArray;
        second.member = None;
        delivery.send(&second);
        let failed = String::from_utf8(received(&journal)).unwrap();
        assert!(failed.contains("ALERT FAILED"), "{failed}");
        assert!(failed.contains("NVRAID_EVENT=Fail"), "{failed}");
        std::fs::write(&flag, "").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&out).map_or(0, |s| s.lines().count()) < 2 {
            assert!(Instant::now() < deadline, "not delivered after the retry");
            std::thread::sleep(Duration::from_millis(20));
        }
        delivery.stop();
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            "Fail /tmp/m1\nDegradedArray \n"
        );
    }
}
