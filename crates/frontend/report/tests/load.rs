//! Loading results: every refusal names the file, and the field when one
//! is at fault.

mod common;

use std::path::{Path, PathBuf};

use common::{fixture_json, fixture_path, FIXTURES};
use nvraid_report::{from_value, load, ReportError};
use serde_json::json;

/// A fresh directory for this test's files.
fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("load")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Loads `text` written to a file `name`, expecting an error; returns it
/// and the path, checking the message names the path.
fn refused(test: &str, name: &str, text: &str) -> (ReportError, String) {
    let path = scratch(test).join(name);
    std::fs::write(&path, text).expect("write");
    let error = load(&path).expect_err("should be refused");
    let shown = path.display().to_string();
    assert!(
        error.to_string().starts_with(&format!("{shown}: ")),
        "{error} does not name {shown}"
    );
    (error, shown)
}

#[test]
fn every_fixture_loads_with_its_schema() {
    for name in FIXTURES {
        let input = load(&fixture_path(name)).unwrap();
        assert_eq!(input.name(), fixture_path(name).display().to_string());
        let expected = fixture_json(name)["schema"].as_str().unwrap().to_string();
        assert_eq!(input.schema(), expected);
    }
}

#[test]
fn unreadable_file() {
    let path = scratch("unreadable").join("missing.json");
    let error = load(&path).unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, ReportError::Read { .. }));
    assert!(message.starts_with(&format!("{}: cannot read: ", path.display())));
}

#[test]
fn not_json() {
    let (error, path) = refused("not_json", "bad.json", "{\"schema\": \"nvraid-bench/1\",");
    assert!(matches!(error, ReportError::NotJson { .. }));
    assert!(error
        .to_string()
        .starts_with(&format!("{path}: not JSON: ")));
}

#[test]
fn no_schema() {
    let (error, path) = refused("no_schema", "fio.json", "{\"jobs\": []}");
    assert_eq!(
        error.to_string(),
        format!("{path}: not an nvraid result (no \"schema\" field)")
    );
    // A non-object document has no schema either.
    let (error, _) = refused("no_schema_array", "list.json", "[1, 2]");
    assert!(matches!(error, ReportError::NoSchema { .. }));
}

#[test]
fn unknown_schema_lists_the_known_ones() {
    let (error, path) = refused("unknown", "x.json", "{\"schema\": \"fio/3\"}");
    assert_eq!(
        error.to_string(),
        format!(
            "{path}: unknown schema \"fio/3\"; this nvraid reads nvraid-bench/1, \
             nvraid-tune/1 and nvraid-topology/1"
        )
    );
}

#[test]
fn newer_version_is_refused() {
    let (error, path) = refused(
        "newer",
        "b.json",
        "{\"schema\": \"nvraid-bench/2\", \"jobs\": []}",
    );
    assert_eq!(
        error.to_string(),
        format!(
            "{path}: nvraid-bench/2 was written by a newer nvraid; this one reads nvraid-bench/1"
        )
    );
    let (error, _) = refused(
        "newer_topology",
        "t.json",
        "{\"schema\": \"nvraid-topology/7\"}",
    );
    assert!(matches!(error, ReportError::NewerVersion { .. }));
}

#[test]
fn a_version_nvraid_never_wrote_is_refused() {
    let (error, path) = refused("version", "b.json", "{\"schema\": \"nvraid-bench/x\"}");
    assert_eq!(
        error.to_string(),
        format!(
            "{path}: field `schema` is \"nvraid-bench/x\", no version nvraid has written; \
             this one reads nvraid-bench/1"
        )
    );
}

#[test]
fn a_field_of_the_wrong_type_names_file_and_field() {
    let mut json = fixture_json("bench-cdm.json");
    json["jobs"][2]["read"]["iops"] = json!("fast");
    let text = serde_json::to_string(&json).unwrap();
    let (error, path) = refused("wrong_type", "cdm.json", &text);
    assert_eq!(
        error.to_string(),
        format!("{path}: field `jobs[2].read.iops` should be a number, found a string")
    );
}

#[test]
fn malformed_content_of_each_kind_is_an_error_not_a_panic() {
    let cases = [
        (
            "bench-cdm.json",
            "/jobs/0/job options/iodepth",
            json!("deep"),
            "jobs[0].job options.iodepth",
        ),
        (
            "bench-cdm.json",
            "/jobs/1/job options/bs",
            json!("huge"),
            "jobs[1].job options.bs",
        ),
        (
            "bench-cdm.json",
            "/jobs/3/job options/rw",
            json!("trim"),
            "jobs[3].job options.rw",
        ),
        ("bench-cdm.json", "/layout", json!(3), "layout"),
        (
            "bench-atto.json",
            "/machine/nproc",
            json!("two"),
            "machine.nproc",
        ),
        (
            "tune.json",
            "/chunks/4/values/SEQ1M Q8T1 read",
            json!(null),
            "chunks[4].values.SEQ1M Q8T1 read",
        ),
        (
            "tune.json",
            "/recommendation/within_noise",
            json!("32K"),
            "recommendation.within_noise",
        ),
        (
            "topology-plan.json",
            "/plan/read/limited_by/kind",
            json!("magic"),
            "plan.read.limited_by",
        ),
        (
            "topology.json",
            "/topology/devices/0/name",
            json!(7),
            "topology.devices[0].name",
        ),
    ];
    for (name, pointer, value, field) in cases {
        let mut json = fixture_json(name);
        *json
            .pointer_mut(pointer)
            .unwrap_or_else(|| panic!("{pointer}")) = value;
        let error = from_value(name, json).expect_err(pointer);
        let message = error.to_string();
        assert!(
            message.starts_with(&format!("{name}: field `{field}` ")),
            "{message}"
        );
    }
}

#[test]
fn a_missing_field_is_named() {
    let mut json = fixture_json("tune.json");
    json.as_object_mut().unwrap().remove("metrics");
    let error = from_value("tune.json", json).unwrap_err();
    assert_eq!(error.to_string(), "tune.json: field `metrics` is missing");
}

#[test]
fn results_from_before_provenance_still_load() {
    let mut json = fixture_json("bench-cdm.json");
    for key in ["command", "subject", "machine", "timestamp"] {
        json.as_object_mut().unwrap().remove(key);
    }
    let input = from_value("old.json", json).unwrap();
    let page = nvraid_report::render_html(&[input], "t").unwrap();
    assert!(page.contains("not recorded"));
}
