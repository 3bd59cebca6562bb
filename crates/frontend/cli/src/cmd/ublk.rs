//! `nvraid ublk`: the ublk devices on this machine, and releasing one
//! whose server is gone.

use anyhow::Result;
use clap::{Args, Subcommand};

#[derive(Args, Debug)]
pub struct UblkArgs {
    #[command(subcommand)]
    command: UblkCommand,
}

#[derive(Subcommand, Debug)]
enum UblkCommand {
    /// List the ublk devices: number, state, serving process, queues.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a device whose server is gone (killed, its array not to be
    /// served here again): the I/O waiting on it fails, and its number is
    /// free. A running server's device is refused (stop the server).
    Delete {
        /// The device number (N of /dev/ublkbN).
        id: u32,
    },
    /// Print the name of the configured array served as DEVICE (ublkbN,
    /// /dev/ublkbN or N), from the run directory's record (what the udev
    /// rule for /dev/nvraid/NAME runs). Exit 1 when no array has it.
    Name {
        /// ublkbN, /dev/ublkbN or N.
        device: String,
    },
}

pub fn run(args: &UblkArgs) -> Result<u8> {
    match &args.command {
        UblkCommand::List { json } => {
            let devices = nvraid_serve::ublk_devices()?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&devices)?);
                return Ok(0);
            }
            if devices.is_empty() {
                println!("no ublk devices");
            }
            for d in devices {
                let server = d.server_pid.map_or("no server".to_string(), |pid| {
                    format!("served by process {pid}")
                });
                println!(
                    "{}  {}  {server}  {} queues of {}{}",
                    d.path,
                    d.state,
                    d.queues,
                    d.depth,
                    if d.recoverable { "  recoverable" } else { "" }
                );
            }
            Ok(0)
        }
        UblkCommand::Name { device } => {
            let number = device
                .trim_start_matches("/dev/")
                .trim_start_matches("ublkb")
                .parse::<u32>()
                .map_err(|_| anyhow::anyhow!("{device:?} is not ublkbN, /dev/ublkbN or N"))?;
            let run = nvraid_service::incremental::RunDir::from_env();
            match run.name_of_ublk(number) {
                Some(name) => {
                    println!("{name}");
                    Ok(0)
                }
                None => anyhow::bail!(
                    "no array's record in {} holds ublk device {number}",
                    run.root.join("ublk").display()
                ),
            }
        }
        UblkCommand::Delete { id } => {
            nvraid_serve::release_ublk(*id)?;
            println!("/dev/ublkb{id}: deleted");
            Ok(0)
        }
    }
}
