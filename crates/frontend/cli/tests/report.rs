//! `nvraid report` and `bench --html` through the binary: a page from a
//! real run, refusals that name the file and leave no page behind.

mod common;

use common::*;

#[test]
fn bench_html_and_report_draw_a_real_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let json = ok(
        &[
            "bench",
            "mem:64M",
            "mem:64M",
            "--level",
            "0",
            "--rw",
            "randread",
            "--iodepth",
            "4",
            "--runtime",
            "100ms",
            "--json",
            "--html",
            "run.html",
        ],
        d,
    );
    std::fs::write(d.join("run.json"), &json).unwrap();
    let direct = std::fs::read_to_string(d.join("run.html")).unwrap();
    ok(
        &[
            "report",
            "run.json",
            "-o",
            "report.html",
            "--title",
            "a <b> & c",
        ],
        d,
    );
    let page = std::fs::read_to_string(d.join("report.html")).unwrap();
    for page in [&direct, &page] {
        assert!(page.contains("data-chart=\"latency\""), "no latency chart");
        assert!(page.contains("<svg"), "no SVG");
        assert!(
            page.contains("raid0, 2 members, chunk 64 KiB"),
            "the array is not named"
        );
        assert!(
            page.contains("bench mem:64M mem:64M --level 0"),
            "the command is not shown"
        );
        assert!(
            !page.contains("<script src") && !page.contains("<link"),
            "the page fetches something"
        );
    }
    assert!(
        page.contains("a &lt;b&gt; &amp; c"),
        "the title is not escaped"
    );
}

#[test]
fn report_refuses_what_it_cannot_read_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("newer.json"),
        r#"{"schema": "nvraid-bench/2", "jobs": []}"#,
    )
    .unwrap();
    std::fs::write(d.join("alien.json"), r#"{"jobs": []}"#).unwrap();
    std::fs::write(d.join("broken.json"), "{").unwrap();
    refused(
        &["report", "newer.json", "-o", "out.html"],
        d,
        &["newer.json", "newer nvraid"],
    );
    refused(
        &["report", "alien.json", "-o", "out.html"],
        d,
        &["alien.json", "schema"],
    );
    refused(
        &["report", "broken.json", "-o", "out.html"],
        d,
        &["broken.json"],
    );
    refused(
        &["report", "missing.json", "-o", "out.html"],
        d,
        &["missing.json"],
    );
    assert!(!d.join("out.html").exists());
    refused(
        &[
            "bench",
            "mem:64M",
            "--rw",
            "read",
            "--runtime",
            "50ms",
            "--html",
            "no/such/dir/x.html",
        ],
        d,
        &["no/such/dir/x.html", "no such directory"],
    );
}
