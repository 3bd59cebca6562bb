//! `nvraid serve` and `nvraid status`: export an array over NBD, and ask a
//! running server how it is doing.

use anyhow::{Context, Result};
use clap::Args;
use nvraid_array::{assemble, info, Array, AssembleOptions, FanoutTarget};
use nvraid_bench::cli::Engine;
use nvraid_io::queue::Target;
use nvraid_member::Member;
use nvraid_serve::cli::ServeArgs;
use nvraid_serve::{ServeOptions, ShutdownHandle};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct ServeCmd {
    #[command(flatten)]
    serve: ServeArgs,
    /// I/O engine for the workers (auto: psync for RAM-backed members,
    /// io_uring otherwise).
    #[arg(long, value_enum, default_value = "auto")]
    engine: Engine,
    /// Members of the array to serve, in any order.
    #[arg(required = true)]
    members: Vec<String>,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The server's control socket (default: the listen socket with .ctl).
    #[arg(long)]
    socket: PathBuf,
    /// Print the raw JSON.
    #[arg(long)]
    json: bool,
}

pub fn serve(args: &ServeCmd, direct: bool) -> Result<u8> {
    let mut options = args.serve.to_options().map_err(anyhow::Error::msg)?;
    let writable = !options.read_only;
    let array = Arc::new(assemble(
        &args.members,
        AssembleOptions {
            writable,
            direct,
            allow_degraded: true,
        },
    )?);
    configure(&mut options, &array);
    let members: Vec<&Member> = array.slots().iter().flatten().map(|s| &s.member).collect();
    let engine = crate::cmd::bench::engine_for(args.engine, &members);
    let target: Arc<dyn Target> = Arc::new(FanoutTarget::array(array.clone(), engine));
    let shutdown = ShutdownHandle::new();
    watch_signals(shutdown.clone())?;
    eprintln!(
        "nvraid: serving {} ({} bytes) until SIGINT/SIGTERM",
        target.describe(),
        target.size_bytes(),
    );
    let served = nvraid_serve::serve(target, options, shutdown);
    // The server has stopped, finished in-flight requests and flushed; only
    // then is the array marked clean.
    served.context("the NBD server failed; the array is left as it is")?;
    let array = Arc::try_unwrap(array)
        .map_err(|_| anyhow::anyhow!("array still in use after the server stopped"))?;
    array.close()?;
    eprintln!("nvraid: stopped; array flushed and closed");
    Ok(0)
}

fn configure(options: &mut ServeOptions, array: &Arc<Array>) {
    let chunk = array.geometry().chunk_bytes().unwrap_or(4096);
    options.preferred_block_bytes = (chunk as u32).clamp(array.sector_bytes(), 1 << 20);
    let status_array = array.clone();
    options.status_hook = Some(Arc::new(move || array_status(&status_array)));
}

/// The array as `detail` shows it, each member with the I/O the server's
/// queues have done on it (`io`: ops, bytes, errors).
fn array_status(array: &Array) -> serde_json::Value {
    let mut value = serde_json::to_value(info::detail(array)).unwrap_or_default();
    if let Some(members) = value["members"].as_array_mut() {
        for member in members {
            let Some(role) = member["role"].as_u64() else {
                continue;
            };
            let Some(counters) = array.member_counters().get(role as usize) else {
                continue;
            };
            member["io"] = serde_json::json!({
                "ops": counters.ops.load(Ordering::Relaxed),
                "bytes": counters.bytes.load(Ordering::Relaxed),
                "errors": counters.errors.load(Ordering::Relaxed),
            });
        }
    }
    value
}

fn watch_signals(shutdown: ShutdownHandle) -> Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("cannot install signal handlers")?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                eprintln!("nvraid: signal {signal}: finishing in-flight requests");
                shutdown.trigger();
            }
        })?;
    Ok(())
}

pub fn status(args: &StatusArgs) -> Result<u8> {
    let status = nvraid_serve::query_status(&args.socket)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
        return Ok(0);
    }
    let text = nvraid_serve::format_status(&status);
    // The server's own lines, then the array as a table instead of raw JSON.
    text.lines()
        .filter(|line| !line.starts_with("array: "))
        .for_each(|line| println!("{line}"));
    print_array(&status["array"]);
    Ok(0)
}

fn print_array(array: &serde_json::Value) {
    if array.is_null() {
        return;
    }
    println!(
        "array: {} raid{} {} bytes, state {}, events {}",
        array["uuid"].as_str().unwrap_or("?"),
        array["level"],
        array["size_bytes"],
        array["state"].as_str().unwrap_or("?"),
        array["events"]
    );
    println!(
        "  {:>4}  {:<8}  {:>12}  {:>16}  {:>6}  path",
        "role", "state", "ops", "bytes", "errors"
    );
    for m in array["members"].as_array().into_iter().flatten() {
        let io = &m["io"];
        println!(
            "  {:>4}  {:<8}  {:>12}  {:>16}  {:>6}  {}",
            m["role"].as_u64().map_or("-".into(), |r| r.to_string()),
            m["state"].as_str().unwrap_or("?"),
            io["ops"].as_u64().unwrap_or(0),
            io["bytes"].as_u64().unwrap_or(0),
            io["errors"].as_u64().unwrap_or(0),
            m["path"].as_str().unwrap_or("(missing)")
        );
    }
}
