//! `nvraid report`: one self-contained HTML page from the JSON results of
//! bench, tune and topology (nvraid-report draws it).

use anyhow::{Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Where the page goes.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: PathBuf,
    /// The page's title (default: "nvraid report").
    #[arg(long)]
    title: Option<String>,
    /// Results to draw: files written by `bench --json`, `tune --json` or
    /// `topology --json`, in the order the page shows them.
    #[arg(required = true, value_name = "RESULT.json")]
    results: Vec<PathBuf>,
}

pub fn run(args: &ReportArgs) -> Result<u8> {
    // Every input is read and checked before the page is written.
    let inputs = args
        .results
        .iter()
        .map(|path| nvraid_report::load(path))
        .collect::<Result<Vec<_>, _>>()?;
    let title = args.title.as_deref().unwrap_or("nvraid report");
    let page = nvraid_report::render_html(&inputs, title)?;
    write_page(&args.output, &page)?;
    eprintln!(
        "nvraid: wrote {} ({} result(s))",
        args.output.display(),
        inputs.len()
    );
    Ok(0)
}

/// Writes `page` to `path` through a temporary file beside it, so that a
/// failure never leaves half a page.
pub fn write_page(path: &Path, page: &str) -> Result<()> {
    let temporary = path.with_extension("html.partial");
    std::fs::write(&temporary, page)
        .and_then(|()| std::fs::rename(&temporary, path))
        .with_context(|| format!("cannot write {}", path.display()))
}

/// The page for one bench run's JSON, as `bench --html` writes it.
pub fn bench_page(json: serde_json::Value, path: &Path) -> Result<()> {
    let input = nvraid_report::from_value("this run", json)?;
    let page = nvraid_report::render_html(&[input], "nvraid bench")?;
    write_page(path, &page)
}
