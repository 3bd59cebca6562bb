//! `nvraid man` and `nvraid completions`: generated from the same clap
//! definitions as `--help`, so they cannot drift from the parser.

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ManArgs {
    /// Write nvraid.1 and one page per command (nvraid-create.1, ...) into
    /// this directory instead of printing nvraid.1 to stdout.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    shell: Shell,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Shell {
    Bash,
    Zsh,
    Fish,
}

pub fn man(args: &ManArgs, command: clap::Command) -> Result<u8> {
    match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("{}", dir.display()))?;
            clap_mangen::generate_to(command, dir)
                .with_context(|| format!("writing man pages into {}", dir.display()))?;
            eprintln!("nvraid: man pages written to {}", dir.display());
        }
        None => {
            let mut out = std::io::stdout().lock();
            clap_mangen::Man::new(command).render(&mut out)?;
        }
    }
    Ok(0)
}

pub fn completions(args: &CompletionsArgs, mut command: clap::Command) -> Result<u8> {
    let shell = match args.shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let name = command.get_name().to_string();
    clap_complete::generate(shell, &mut command, name, &mut std::io::stdout().lock());
    Ok(0)
}
