//! What can go wrong reading a result or drawing the page.

/// Every error names the input (its path, or the name given to
/// [`from_value`](crate::from_value)) it is about.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// The file is not JSON.
    #[error("{file}: not JSON: {source}")]
    NotJson {
        file: String,
        #[source]
        source: serde_json::Error,
    },
    /// The JSON has no top-level `schema` string.
    #[error("{file}: not an nvraid result (no \"schema\" field)")]
    NoSchema { file: String },
    /// The schema names no kind of result this crate knows.
    #[error("{file}: unknown schema \"{schema}\"; this nvraid reads {known}")]
    UnknownSchema {
        file: String,
        schema: String,
        known: String,
    },
    /// The result was written in a later format than this build reads.
    #[error("{file}: {schema} was written by a newer nvraid; this one reads {supported}")]
    NewerVersion {
        file: String,
        schema: String,
        supported: String,
    },
    /// A field the page needs is missing or has the wrong type.
    #[error("{file}: field `{field}` {problem}")]
    Field {
        file: String,
        field: String,
        problem: String,
    },
    /// `render_html` was given nothing to show.
    #[error("no results to report on: give at least one nvraid JSON result")]
    NoInputs,
    /// plotters failed to draw a chart.
    #[error("{file}: cannot draw the {chart} chart: {reason}")]
    Draw {
        file: String,
        chart: &'static str,
        reason: String,
    },
}
