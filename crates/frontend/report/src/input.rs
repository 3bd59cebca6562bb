//! Loading a result: reading the file, checking its `schema` and turning
//! its JSON into the typed model the page is drawn from.

use std::path::Path;

use serde_json::Value;

use crate::error::ReportError;
use crate::json::Node;
use crate::model::{Bench, Topology, Tune};

/// The kinds of result this build reads, with the newest version of each.
const SCHEMAS: [(&str, u32); 3] = [
    ("nvraid-bench", 1),
    ("nvraid-tune", 1),
    ("nvraid-topology", 1),
];

/// One nvraid result, checked and ready to render.
#[derive(Debug, Clone)]
pub struct Input {
    name: String,
    pub(crate) content: Content,
}

/// What a result holds, by kind.
#[derive(Debug, Clone)]
pub(crate) enum Content {
    Bench(Bench),
    Tune(Tune),
    Topology(Topology),
}

impl Input {
    /// The name the input was loaded under: its path, or the name given to
    /// [`from_value`]. The page heads the input's section with it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The schema the input was written in, such as `"nvraid-bench/1"`.
    pub fn schema(&self) -> String {
        let kind = match self.content {
            Content::Bench(_) => "nvraid-bench",
            Content::Tune(_) => "nvraid-tune",
            Content::Topology(_) => "nvraid-topology",
        };
        let version = SCHEMAS
            .iter()
            .find(|(name, _)| *name == kind)
            .map_or(0, |(_, version)| *version);
        format!("{kind}/{version}")
    }
}

/// The most read from one result file (a tune of many chunk sizes with
/// its histograms is a few MiB); a longer file, or a path such as
/// `/dev/zero`, is refused instead of read until memory runs out.
pub const INPUT_MAX_BYTES: u64 = 64 << 20;

/// The text of `path`, at most [`INPUT_MAX_BYTES`] of it.
fn read_bounded(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(INPUT_MAX_BYTES + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > INPUT_MAX_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "longer than {} MiB (the most read from a result file); is it the right file?",
                INPUT_MAX_BYTES >> 20
            ),
        ));
    }
    Ok(text)
}

/// Reads and checks the nvraid JSON result at `path`. Every error names
/// the file.
pub fn load(path: &Path) -> Result<Input, ReportError> {
    let name = path.display().to_string();
    let text = read_bounded(path).map_err(|source| ReportError::Read {
        file: name.clone(),
        source,
    })?;
    let value = serde_json::from_str(&text).map_err(|source| ReportError::NotJson {
        file: name.clone(),
        source,
    })?;
    from_value(&name, value)
}

/// Checks an nvraid result already parsed into `value` (for example one a
/// command has just produced); `name` stands for the file in the page and
/// in errors.
pub fn from_value(name: &str, value: Value) -> Result<Input, ReportError> {
    let root = Node::root(name, &value);
    let kind = schema_kind(name, &value)?;
    let content = match kind {
        "nvraid-bench" => Content::Bench(Bench::read(root)?),
        "nvraid-tune" => Content::Tune(Tune::read(root)?),
        _ => Content::Topology(Topology::read(root)?),
    };
    Ok(Input {
        name: name.to_string(),
        content,
    })
}

/// The kind named by the value's `schema`, once its version is known to
/// be one this build reads.
fn schema_kind(file: &str, value: &Value) -> Result<&'static str, ReportError> {
    let Some(schema) = value.get("schema").and_then(Value::as_str) else {
        return Err(ReportError::NoSchema {
            file: file.to_string(),
        });
    };
    let (kind, version) = schema.rsplit_once('/').unwrap_or((schema, ""));
    let Some(&(known_kind, supported)) = SCHEMAS.iter().find(|(name, _)| *name == kind) else {
        return Err(ReportError::UnknownSchema {
            file: file.to_string(),
            schema: schema.to_string(),
            known: known_schemas(),
        });
    };
    match version.parse::<u32>() {
        Ok(v) if v == supported => Ok(known_kind),
        Ok(v) if v > supported => Err(ReportError::NewerVersion {
            file: file.to_string(),
            schema: schema.to_string(),
            supported: format!("{known_kind}/{supported}"),
        }),
        _ => Err(ReportError::Field {
            file: file.to_string(),
            field: "schema".to_string(),
            problem: format!(
                "is \"{schema}\", no version nvraid has written; this one reads {known_kind}/{supported}"
            ),
        }),
    }
}

/// "nvraid-bench/1, nvraid-tune/1 and nvraid-topology/1".
fn known_schemas() -> String {
    let names: Vec<String> = SCHEMAS
        .iter()
        .map(|(name, version)| format!("{name}/{version}"))
        .collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => names.concat(),
    }
}
