//! `nvraid grow --consistency-policy bitmap|resync|ppl` and mdadm's
//! `--bitmap internal|none`: the array's consistency policy changed
//! offline (`nvraid_array::reshape::change_policy`, docs/reshape.md).

use anyhow::{bail, Result};
use nvraid_array::reshape::{change_policy, Policy};
use nvraid_member::format_size;

/// Change the policy of the array on `members`; exit code 0.
pub fn run(
    members: &[String],
    policy: Option<&str>,
    bitmap: Option<&str>,
    bitmap_chunk: Option<u64>,
    json: bool,
    direct: bool,
) -> Result<u8> {
    let to = match (policy, bitmap) {
        (Some("bitmap"), None) | (None, Some("internal")) => Policy::Bitmap {
            chunk_bytes: bitmap_chunk,
        },
        (Some("resync"), None) | (None, Some("none")) => Policy::Resync,
        (Some("ppl"), None) => Policy::Ppl,
        (Some(other), None) => bail!(
            "--consistency-policy {other}: not a policy nvraid changes to (bitmap, resync or ppl; md's journal policy comes with a journal member: `nvraid add-journal`)"
        ),
        (None, Some(other)) => {
            bail!("--bitmap {other}: give internal (add md's write-intent bitmap) or none (remove it)")
        }
        _ => bail!("give --consistency-policy or --bitmap"),
    };
    if bitmap_chunk.is_some() && !matches!(to, Policy::Bitmap { .. }) {
        bail!("--bitmap-chunk goes with a bitmap being added (--bitmap internal or --consistency-policy bitmap)");
    }
    let changed = change_policy(members, to, direct)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&changed)?);
        return Ok(0);
    }
    if !changed.changed {
        println!(
            "the consistency policy is {} already; nothing was written",
            changed.to
        );
        return Ok(0);
    }
    let detail = match (changed.bitmap_chunk_bytes, changed.ppl_area_bytes) {
        (Some(chunk), _) => format!(" (bitmap chunk {})", format_size(chunk)),
        (_, Some(area)) => format!(" (log area {} on each member)", format_size(area)),
        _ => String::new(),
    };
    println!(
        "consistency policy changed from {} to {}{detail}; events {}",
        changed.from, changed.to, changed.events
    );
    Ok(0)
}
