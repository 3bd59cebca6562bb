//! The page drawn from each fixture: which charts appear, and whether
//! what they draw follows from the data.

mod common;

use std::collections::BTreeSet;

use common::{all_fixtures, fixture, fixture_json, FIXTURES};
use nvraid_report::{from_value, render_html, ReportError};
use serde_json::{json, Value};

/// Every chart name the page can contain.
const CHARTS: [&str; 6] = ["cdm", "atto", "heatmap", "latency", "stripe", "topology"];

/// Series colours the charts use, as plotters writes them.
const READ: &str = "fill=\"#0072B2\"";
const WRITE: &str = "fill=\"#D55E00\"";
const THIRD: &str = "fill=\"#009E73\"";
const RECOMMENDED: &str = "fill=\"#CFEBD6\"";
/// Data lines are 2 px wide; axes 1 px and legend samples 3 px.
const DATA_LINE: &str = "stroke-width=\"2\" points=";

/// The page of the fixture `name` alone.
fn page_of(name: &str) -> String {
    render_html(&[fixture(name)], name).expect("page renders")
}

/// The `<figure>`s of `page` whose `data-chart` is `chart`.
fn charts<'a>(page: &'a str, chart: &str) -> Vec<&'a str> {
    let marker = format!("<figure data-chart=\"{chart}\">");
    page.match_indices(&marker)
        .map(|(start, _)| {
            let end = page[start..].find("</figure>").expect("figure closed");
            &page[start..start + end]
        })
        .collect()
}

/// The only chart `chart` of `page`.
fn chart<'a>(page: &'a str, chart: &str) -> &'a str {
    let found = charts(page, chart);
    assert_eq!(found.len(), 1, "one {chart} chart expected");
    found[0]
}

/// The chart names `page` contains.
fn chart_names(page: &str) -> BTreeSet<&'static str> {
    CHARTS
        .into_iter()
        .filter(|name| !charts(page, name).is_empty())
        .collect()
}

fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

fn jobs(json: &Value) -> &Vec<Value> {
    json["jobs"].as_array().expect("jobs")
}

fn reads(job: &Value) -> bool {
    matches!(
        job["job options"]["rw"].as_str(),
        Some("read" | "randread" | "randrw")
    )
}

/// Percentile points of a job.
fn percentiles(job: &Value) -> usize {
    job["nvraid"]["clat_ns"]["percentile"]
        .as_object()
        .map_or(0, |p| p.len())
}

#[test]
fn every_fixture_renders_with_the_charts_its_kind_supports() {
    let expected: [(&str, &[&str]); 7] = [
        ("bench-cdm.json", &["cdm", "latency"]),
        ("bench-atto.json", &["atto", "latency"]),
        ("bench-sweep.json", &["heatmap", "latency"]),
        ("tune.json", &["stripe"]),
        ("topology.json", &[]),
        ("topology-plan.json", &["topology"]),
        ("topology-measure.json", &[]),
    ];
    assert_eq!(expected.len(), FIXTURES.len());
    for (name, wanted) in expected {
        let page = page_of(name);
        let wanted: BTreeSet<&str> = wanted.iter().copied().collect();
        assert_eq!(chart_names(&page), wanted, "{name}");
        for figure in CHARTS.iter().flat_map(|c| charts(&page, c)) {
            assert!(figure.contains("<h3>"), "{name}: a chart without heading");
            assert!(figure.contains("<svg"), "{name}: a chart without SVG");
            assert!(figure.contains("<figcaption>"), "{name}: no caption");
        }
    }
}

#[test]
fn cdm_table_and_bars_follow_the_rows() {
    let page = page_of("bench-cdm.json");
    let json = fixture_json("bench-cdm.json");
    let labels = |pick: fn(&Value) -> bool| -> BTreeSet<&str> {
        jobs(&json)
            .iter()
            .filter(|job| pick(job))
            .map(|job| job["nvraid"]["label"].as_str().unwrap())
            .collect()
    };
    let read_rows = labels(reads).len();
    let write_rows = labels(|job| !reads(job)).len();
    let bars = chart(&page, "cdm");
    // One bar per row and direction, plus the legend's sample.
    assert_eq!(count(bars, READ), read_rows + 1);
    assert_eq!(count(bars, WRITE), write_rows + 1);
    // The table: a row per label, the numbers as CrystalDiskMark shows them.
    assert_eq!(count(&page, "<table class=\"cdm\">"), 1);
    assert!(page.contains("<th>SEQ1M<small>Q8T1</small></th>"));
    assert!(page.contains("<td>25,296.90</td>"), "SEQ1M Q8T1 read MB/s");
    assert!(page.contains("<td>1,204,190</td>"), "RND4K Q32T1 read IOPS");
}

#[test]
fn atto_curve_has_a_point_per_job() {
    let page = page_of("bench-atto.json");
    let json = fixture_json("bench-atto.json");
    let atto = chart(&page, "atto");
    assert_eq!(count(atto, DATA_LINE), 2, "a read and a write line");
    assert_eq!(count(atto, "<circle"), jobs(&json).len());
    for size in ["512B", "4K", "1M", "64M"] {
        assert!(atto.contains(&format!("\n{size}\n")), "tick label {size}");
    }
}

#[test]
fn heatmap_has_a_cell_per_worker_and_depth() {
    let page = page_of("bench-sweep.json");
    let json = fixture_json("bench-sweep.json");
    let distinct = |key: &str| -> BTreeSet<String> {
        jobs(&json)
            .iter()
            .map(|job| job["job options"][key].as_str().unwrap().to_string())
            .collect()
    };
    let cells = distinct("numjobs").len() * distinct("iodepth").len();
    assert_eq!(cells, jobs(&json).len(), "the sweep fills its grid");
    let heatmap = chart(&page, "heatmap");
    // Each cell is outlined in white; its IOPS is written in it.
    assert_eq!(count(heatmap, "fill=\"none\" stroke=\"#FFFFFF\""), cells);
    assert!(heatmap.contains("\n2.23M\n"), "the best cell's value");
    assert!(heatmap.contains("IOPS"), "the colour scale's title");
}

#[test]
fn latency_draws_the_first_jobs_and_names_the_rest() {
    for name in ["bench-cdm.json", "bench-atto.json", "bench-sweep.json"] {
        let page = page_of(name);
        let json = fixture_json(name);
        let with: Vec<&Value> = jobs(&json)
            .iter()
            .filter(|job| percentiles(job) > 0)
            .collect();
        let drawn = &with[..with.len().min(8)];
        let latency = chart(&page, "latency");
        assert_eq!(count(latency, DATA_LINE), drawn.len(), "{name}");
        let points: usize = drawn.iter().map(|job| percentiles(job)).sum();
        assert_eq!(count(latency, "<circle"), points, "{name}");
        for tick in ["50", "90", "99", "99.9", "99.99"] {
            assert!(
                latency.contains(&format!("\n{tick}\n")),
                "{name}: tick {tick}"
            );
        }
        if let Some(first_left_out) = with.get(8) {
            let jobname = first_left_out["jobname"].as_str().unwrap();
            assert!(latency.contains("not drawn"), "{name}");
            assert!(latency.contains(jobname), "{name}: names {jobname}");
        }
    }
}

#[test]
fn stripe_sweep_draws_every_metric_and_marks_the_recommendation() {
    let page = page_of("tune.json");
    let json = fixture_json("tune.json");
    let metrics = json["metrics"].as_array().unwrap().len();
    let chunks = json["chunks"].as_array().unwrap().len();
    let stripe = chart(&page, "stripe");
    assert_eq!(count(stripe, DATA_LINE), metrics);
    assert_eq!(count(stripe, "<circle"), metrics * chunks);
    assert_eq!(
        count(stripe, RECOMMENDED),
        2,
        "the band and its legend sample"
    );
    assert!(stripe.contains("recommended: 128K"));
    // The table: the recommended column highlighted in the header and in
    // every metric's row; the reason and the chunks within noise.
    assert_eq!(count(&page, "class=\"rec\""), 1 + metrics);
    assert!(page.contains("Recommended chunk: 128K."));
    assert!(page.contains("16K, 128K and 256K are within noise (7.0% apart"));
    assert!(page.contains("Tied, within 10 % of the best score: 16K, 128K, 256K."));
}

#[test]
fn topology_chart_has_a_bar_per_known_ceiling() {
    let page = page_of("topology-plan.json");
    let json = fixture_json("topology-plan.json");
    let known = |list: &Value, key: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .filter(|item| item[key].is_number())
            .count()
    };
    let uplinks = known(&json["topology"]["uplinks"], "ceiling_bytes_per_sec");
    let devices = known(&json["topology"]["devices"], "link_ceiling_bytes_per_sec");
    let plan = [&json["plan"]["read"], &json["plan"]["write"]]
        .iter()
        .filter(|c| c["bytes_per_sec"].is_number())
        .count();
    let topology = chart(&page, "topology");
    assert_eq!(count(topology, WRITE), uplinks + 1);
    assert_eq!(count(topology, READ), devices + 1);
    assert_eq!(count(topology, THIRD), plan + 1);
    assert!(page.contains("limited by DMI 3.0, shared by 2 members"));
    assert!(page.contains("limited by the drive nvme2n1 itself (seeds rating)"));
    // A measurement that failed on the machine the fixture comes from.
    assert!(page_of("topology-measure.json").contains("Operation not permitted"));
    // Without a plan or a known ceiling there is nothing to chart.
    assert!(chart_names(&page_of("topology.json")).is_empty());
    assert!(page_of("topology.json").contains("<code>vda</code>"));
}

#[test]
fn text_from_the_results_is_escaped() {
    let mut json = fixture_json("bench-cdm.json");
    json["command"] = json!("nvraid bench '<script>alert(\"x\")</script>' --size 1G && echo ok");
    json["subject"] = json!("raid0 <b>bold</b>");
    json["jobs"][0]["nvraid"]["label"] = json!("SEQ<1M> Q8T1");
    let input = from_value("a<b>&c.json", json).unwrap();
    let page = render_html(&[input], "title <i>").unwrap();
    assert!(!page.contains("<script>"));
    assert!(!page.contains("<b>"));
    assert!(!page.contains("<i>"));
    assert!(page.contains(
        "nvraid bench &#39;&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&#39; --size 1G &amp;&amp; echo ok"
    ));
    assert!(page.contains("<h2>a&lt;b&gt;&amp;c.json</h2>"));
    assert!(page.contains("<title>title &lt;i&gt;</title>"));
    // plotters escapes the label inside the SVG too.
    assert!(chart(&page, "cdm").contains("SEQ&lt;1M&gt; Q8T1"));
}

#[test]
fn the_page_fetches_nothing() {
    let page = render_html(&all_fixtures(), "all").unwrap();
    let without_namespace = page.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
    assert!(!without_namespace.contains("http://"));
    assert!(!without_namespace.contains("https://"));
    for fetching in [
        "src=", "<link", "@import", "url(", "<script", "<img", "<iframe",
    ] {
        assert!(!page.contains(fetching), "{fetching}");
    }
    // Every SVG declared the namespace, and nothing else was removed.
    assert_eq!(
        page.len() - without_namespace.len(),
        count(&page, "<svg") * "xmlns=\"http://www.w3.org/2000/svg\"".len()
    );
}

#[test]
fn a_result_without_jobs_says_so_instead_of_drawing() {
    let mut json = fixture_json("bench-cdm.json");
    json["jobs"] = json!([]);
    json["skipped"] = json!([{"label": "SEQ1M Q8T1", "reason": "device too small"}]);
    let page = render_html(&[from_value("empty.json", json).unwrap()], "t").unwrap();
    assert!(page.contains("No job results in this file"));
    assert!(page.contains("SEQ1M Q8T1: device too small"));
    assert!(chart_names(&page).is_empty());
    assert!(!page.contains("<svg"));

    let mut tune = fixture_json("tune.json");
    tune["chunks"] = json!([]);
    tune["recommendation"] = Value::Null;
    let page = render_html(&[from_value("tune.json", tune).unwrap()], "t").unwrap();
    assert!(page.contains("No chunk results in this file"));
    assert!(!page.contains("<svg"));
}

#[test]
fn every_figure_names_machine_subject_and_command() {
    let page = page_of("bench-sweep.json");
    let figures = count(&page, "<figure");
    assert!(figures >= 3);
    assert_eq!(
        count(
            &page,
            "<dt>Machine</dt><dd>vm: 2 × AMD EPYC, Linux 6.18.44-fc-v669</dd>"
        ),
        figures
    );
    assert_eq!(
        count(
            &page,
            "<dd>raid0, 2 members, chunk 64 KiB: mem:1G, mem:1G</dd>"
        ),
        figures
    );
    assert_eq!(
        count(
            &page,
            "<code>nvraid bench mem:1G mem:1G --level 0 --preset sweep"
        ),
        figures
    );
}

#[test]
fn no_inputs_is_an_error() {
    assert!(matches!(render_html(&[], "t"), Err(ReportError::NoInputs)));
}

#[test]
fn one_section_per_input_headed_by_its_name() {
    let inputs = all_fixtures();
    let page = render_html(&inputs, "all").unwrap();
    assert_eq!(count(&page, "<section class=\"result\""), inputs.len());
    for input in &inputs {
        assert!(page.contains(&format!("<h2>{}</h2>", input.name())));
    }
}
