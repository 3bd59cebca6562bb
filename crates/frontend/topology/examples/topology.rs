//! Runs `nvraid topology` standalone until the `nvraid` binary wires it in:
//! `cargo run -p nvraid-topology --example topology -- [--fixture z170] [FLAGS]`.

use clap::Parser;
use nvraid_topology::cli::{run, TopologyArgs};

#[derive(Parser)]
struct Command {
    /// Expand tests/fixtures/NAME/sysfs.manifest into a temporary directory and read that.
    #[arg(long, value_name = "NAME")]
    fixture: Option<String>,
    #[command(flatten)]
    args: TopologyArgs,
}

fn main() {
    let mut command = Command::parse();
    let _tree = command.fixture.as_ref().map(|name| {
        let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name)
            .join("sysfs.manifest");
        let text = std::fs::read_to_string(&manifest).expect("fixture manifest");
        let dir = tempfile::tempdir().expect("temp dir");
        nvraid_topology::fixture::expand_manifest(&text, dir.path()).expect("manifest expands");
        command.args.sysfs_root = dir.path().to_path_buf();
        dir
    });
    let mut out = std::io::stdout().lock();
    let code = run(&command.args, None, &mut out).unwrap_or_else(|e| {
        eprintln!("nvraid topology: {e}");
        e.exit_code()
    });
    std::process::exit(code);
}
