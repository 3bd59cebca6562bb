//! The `nvraid` binary: parse the command line, dispatch, print.
//!
//! Exit codes (docs/cli.md):
//! - 0: success;
//! - 1: the command failed or was refused (the message names the culprit);
//! - 2: the command line is invalid;
//! - 3: `assemble --scan` found a degraded array (and none that cannot start);
//! - 4: `assemble --scan` found an array that cannot start;
//! - 5: `check` found copies that differ.

mod cmd;

use clap::{CommandFactory, Parser, Subcommand};
use std::process::ExitCode;

/// Software RAID for NVMe drives, using Linux md's on-disk format.
#[derive(Parser, Debug)]
#[command(name = "nvraid", version, about, long_about = None)]
struct Cli {
    /// Open members with buffered I/O instead of O_DIRECT.
    #[arg(long, global = true)]
    buffered: bool,
    /// NBD members: accept exports whose server cannot FLUSH for writing.
    /// Writes such a server acknowledged can be lost when it crashes or
    /// loses power, though the array reports them durable.
    #[arg(long, global = true)]
    unsafe_no_flush: bool,
    /// NBD and NVMe/TCP members: a request with no reply for this long
    /// ends its connection and fails (a failed member operation marks the member
    /// faulty on redundant levels). Every member operation completes
    /// within this, reconnections included. E.g. 30s, 500ms.
    #[arg(long, global = true, value_name = "DURATION", default_value = "30s",
          value_parser = parse_duration)]
    nbd_timeout: std::time::Duration,
    /// NBD and NVMe/TCP members: connecting and the handshake (for
    /// NVMe/TCP: the admin queue, Identify) must finish within this
    /// (a later connection, which operations wait for, within
    /// --nbd-timeout too).
    #[arg(long, global = true, value_name = "DURATION", default_value = "10s",
          value_parser = parse_duration)]
    nbd_connect_timeout: std::time::Duration,
    /// NBD members over TLS (nbds://): the CA certificate(s), PEM, that
    /// signed the servers' certificates.
    #[arg(long, global = true, value_name = "FILE")]
    nbd_tls_ca: Option<std::path::PathBuf>,
    /// NBD members over TLS: this client's certificate chain (PEM), for
    /// servers that verify their clients.
    #[arg(long, global = true, value_name = "FILE", requires = "nbd_tls_key")]
    nbd_tls_cert: Option<std::path::PathBuf>,
    /// NBD members over TLS: the private key of --nbd-tls-cert (PEM).
    #[arg(long, global = true, value_name = "FILE", requires = "nbd_tls_cert")]
    nbd_tls_key: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create an array: write md v1.2 superblocks to every member.
    Create(cmd::create::CreateArgs),
    /// Show one member's superblock (like `mdadm --examine`).
    Examine(cmd::examine::ExamineArgs),
    /// Assemble the array the members form and show it.
    Detail(cmd::detail::DetailArgs),
    /// Assemble members, or find arrays among paths with --scan.
    Assemble(cmd::assemble::AssembleArgs),
    /// Copy bytes from a file or stdin into the array.
    Write(cmd::io::WriteArgs),
    /// Put a new member into a degraded RAID 1/10/4/5/6 and rebuild it (or add a spare).
    Add(cmd::manage::AddArgs),
    /// Give a RAID 4/5/6 md's write journal on a member of its own (mdadm's --add-journal).
    AddJournal(cmd::manage::AddJournalArgs),
    /// Add members to a RAID 4/5/6 or RAID 10 near and reshape it in md's format, or mirrors to a RAID 1 (offline; --continue resumes a reshape).
    Grow(cmd::grow::GrowArgs),
    /// Finish the rebuild of members whose recovery was cut short.
    Rebuild(cmd::manage::RebuildArgs),
    /// Take a member of a redundant array out and rebuild a new one in its place.
    Replace(cmd::manage::ReplaceArgs),
    /// Mark a member faulty (offline, or in a running server with --socket).
    Fail(cmd::manage::FailArgs),
    /// Take a faulty member or an unused spare out of a running server's array.
    Remove(cmd::manage::RemoveArgs),
    /// Compare every copy (RAID 1/10) or parity (RAID 4/5/6) with the data; report the sectors that differ.
    Check(cmd::manage::ScrubArgs),
    /// Rewrite copies that differ from the first, or parity from the data; resync a dirty array.
    Repair(cmd::manage::ScrubArgs),
    /// Copy bytes out of the array to a file or stdout.
    Read(cmd::io::ReadArgs),
    /// Measure an array, raw members, or (with no member) a temporary RAID 0.
    Bench(nvraid_bench::BenchArgs),
    /// Read the PCIe tree and say where an array's ceiling is, and why.
    Topology(nvraid_topology::cli::TopologyArgs),
    /// Measure throwaway arrays of each chunk size and recommend one (destroys the members' data).
    Tune(cmd::tune::TuneArgs),
    /// Draw bench, tune and topology JSON results as one HTML page.
    Report(cmd::report::ReportArgs),
    /// Export the array over NBD and/or as a ublk block device until SIGINT/SIGTERM.
    Serve(Box<cmd::serve::ServeCmd>),
    /// Show a running server's array, connections and rates.
    Status(cmd::serve::StatusArgs),
    /// List ublk devices, delete one whose server is gone, or name one's array.
    Ublk(cmd::ublk::UblkArgs),
    /// Declare the arrays started at boot (nvraid.conf), and keep mdadm away from them.
    Config(cmd::config::ConfigArgs),
    /// Start a configured array: find its members and become `nvraid serve` (the service's start).
    Run(cmd::run::RunArgs),
    /// Print the man page (roff), or write every command's page with --dir.
    Man(cmd::manual::ManArgs),
    /// Print shell completions: bash, zsh or fish.
    Completions(cmd::manual::CompletionsArgs),
}

/// mimalloc: the data path frees on one thread what another allocated (a
/// write's log pages, a round's lists); glibc's arenas then contend on a
/// lock, which the write-back thread and the workers met hundreds of times a
/// second under `serve --cache journal`.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    quiet_when_stdout_closes();
    let cli = Cli::parse();
    let direct = !cli.buffered;
    nvraid_member::set_remote_defaults(
        cli.unsafe_no_flush,
        nvraid_member::RemoteOptions {
            request_timeout: cli.nbd_timeout,
            connect_timeout: cli.nbd_connect_timeout,
        },
    );
    if let Some(ca) = &cli.nbd_tls_ca {
        let identity = cli.nbd_tls_cert.as_deref().zip(cli.nbd_tls_key.as_deref());
        if let Err(e) = nvraid_remote::tls::configure(ca, identity) {
            eprintln!("nvraid: --nbd-tls-ca: {e}");
            return ExitCode::from(2);
        }
    } else if cli.nbd_tls_cert.is_some() {
        eprintln!("nvraid: --nbd-tls-cert needs --nbd-tls-ca (the CA that signed the servers)");
        return ExitCode::from(2);
    }
    let result = match &cli.command {
        Command::Create(args) => cmd::create::run(args, direct),
        Command::Examine(args) => cmd::examine::run(args),
        Command::Detail(args) => cmd::detail::run(args, direct),
        Command::Assemble(args) => cmd::assemble::run(args, direct),
        Command::Write(args) => cmd::io::write(args, direct),
        Command::Add(args) => cmd::manage::add(args, direct),
        Command::AddJournal(args) => cmd::manage::add_journal(args, direct),
        Command::Grow(args) => cmd::grow::run(args, direct),
        Command::Rebuild(args) => cmd::manage::rebuild(args, direct),
        Command::Fail(args) => cmd::manage::fail(args, direct),
        Command::Remove(args) => cmd::manage::remove(args),
        Command::Replace(args) => cmd::manage::replace(args, direct),
        Command::Check(args) => cmd::manage::check(args, direct),
        Command::Repair(args) => cmd::manage::repair(args, direct),
        Command::Read(args) => cmd::io::read(args, direct),
        Command::Bench(args) => cmd::bench::run(args, direct),
        Command::Topology(args) => cmd::topology::run(args),
        Command::Tune(args) => cmd::tune::run(args, direct),
        Command::Report(args) => cmd::report::run(args),
        Command::Serve(args) => cmd::serve::serve(args, direct),
        Command::Status(args) => cmd::serve::status(args),
        Command::Ublk(args) => cmd::ublk::run(args),
        Command::Config(args) => cmd::config::run(args),
        Command::Run(args) => cmd::run::run(args, direct),
        Command::Man(args) => cmd::manual::man(args, Cli::command()),
        Command::Completions(args) => cmd::manual::completions(args, Cli::command()),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) if is_broken_stdout(&e) => nvraid_io::sys::exit_by_sigpipe(),
        Err(e) => {
            eprintln!("nvraid: {}", error_text(&e));
            ExitCode::from(1)
        }
    }
}

/// A reader of nvraid's output that stops early (`nvraid detail --json |
/// head`) ends nvraid as it ends `cat`: quietly, by SIGPIPE. Rust programs
/// ignore that signal (nvraid's sockets rely on it: a peer gone is EPIPE),
/// so the write fails instead: `println!` panics, and other writes return
/// an error (see `main`). Either way, when standard output has no reader
/// any more, the process leaves without a word; any other panic is
/// reported as before.
fn quiet_when_stdout_closes() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        // `println!`'s panic, or a library's (clap's completions) that
        // expected its write to stdout to work.
        let stdout_write = message.starts_with("failed printing to stdout")
            || message.contains("Broken pipe")
            || message.contains("BrokenPipe");
        if stdout_write && nvraid_io::sys::stdout_reader_gone() {
            nvraid_io::sys::exit_by_sigpipe();
        }
        report(info);
    }));
}

/// An error that is a write to standard output after its reader left.
fn is_broken_stdout(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    }) && nvraid_io::sys::stdout_reader_gone()
}

/// `30s`, `500ms`, `2m`, or plain seconds.
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60.0)
    } else {
        (text, 1.0)
    };
    match number.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(std::time::Duration::from_secs_f64(v * scale)),
        _ => Err(format!(
            "{text:?} is not a positive duration (e.g. 30s, 500ms, 2m)"
        )),
    }
}

/// The error and its causes on one line, each cause once: many errors
/// already include their cause's text in their own message, and printing the
/// chain as well would say the same reason twice.
fn error_text(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let part = cause.to_string();
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::error_text;

    #[derive(Debug)]
    struct Inner;
    impl std::fmt::Display for Inner {
        fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("checksum mismatch")
        }
    }
    impl std::error::Error for Inner {}

    #[derive(Debug)]
    struct Outer(Inner);
    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "m0.img: {}", self.0)
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn each_reason_is_printed_once() {
        let e = anyhow::Error::new(Outer(Inner));
        assert_eq!(error_text(&e), "m0.img: checksum mismatch");
        let e = anyhow::Error::new(Inner).context("reading m0.img");
        assert_eq!(error_text(&e), "reading m0.img: checksum mismatch");
    }
}
