//! The page in a real browser: headless Chromium loads the page of every
//! fixture with a small checking script appended, which measures each
//! chart and counts what it drew, and takes a screenshot of the page as
//! it is.
//!
//! Needs Debian's `chromium` package. Without it the test fails: it is
//! never skipped. Set NVRAID_REPORT_SCREENSHOT=PATH to keep a copy of the
//! screenshot.

mod common;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nvraid_report::render_html;
use serde_json::Value;

/// How long one browser run may take before the test gives up on it.
const TIMEOUT: Duration = Duration::from_secs(60);
/// Width of the desktop window, and of a phone's.
const WIDE: u32 = 1280;
const NARROW: u32 = 400;
/// The tallest screenshot taken; Chromium refuses much larger ones.
const MAX_SHOT_HEIGHT: u64 = 16_000;
/// SVG elements the charts are drawn with.
const SHAPES: [&str; 4] = ["rect", "polyline", "circle", "text"];

/// Appended to the page: on load, writes a JSON summary of every
/// `[data-chart]` figure, and any script error, into `<pre id=nvraid-check>`.
const CHECK_SCRIPT: &str = r#"<script>
(function () {
  var errors = [];
  window.addEventListener('error', function (e) { errors.push(String(e.message)); });
  var consoleError = console.error;
  console.error = function () {
    errors.push(Array.prototype.join.call(arguments, ' '));
    consoleError.apply(console, arguments);
  };
  function outside(inner, outer) {
    return inner.left < outer.left - 1 || inner.right > outer.right + 1 ||
      inner.top < outer.top - 1 || inner.bottom > outer.bottom + 1;
  }
  window.addEventListener('load', function () {
    var charts = [];
    document.querySelectorAll('[data-chart]').forEach(function (figure) {
      var entry = { chart: figure.getAttribute('data-chart'), drawn: {}, outside: [] };
      var svg = figure.querySelector('svg');
      if (svg) {
        var box = svg.getBoundingClientRect();
        var bbox = svg.getBBox();
        entry.width = box.width;
        entry.height = box.height;
        entry.content = [bbox.width, bbox.height];
        ['rect', 'polyline', 'circle', 'text'].forEach(function (tag) {
          var drawn = 0;
          svg.querySelectorAll(tag).forEach(function (element) {
            var size = element.getBBox();
            if (size.width > 0 || size.height > 0) { drawn += 1; }
            if (tag === 'text' && outside(element.getBoundingClientRect(), box)) {
              entry.outside.push(element.textContent.trim());
            }
          });
          entry.drawn[tag] = drawn;
        });
      }
      charts.push(entry);
    });
    var pre = document.createElement('pre');
    pre.id = 'nvraid-check';
    pre.textContent = JSON.stringify({
      errors: errors,
      charts: charts,
      height: document.documentElement.scrollHeight,
      viewport: window.innerWidth,
      overflow: document.documentElement.scrollWidth - window.innerWidth
    });
    document.body.appendChild(pre);
  });
})();
</script>
"#;

/// Chromium's path, or a failure saying how to get it.
fn chromium() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    ["chromium", "chromium-browser"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "chromium not found on PATH: this test needs a real browser and is never \
                 skipped; install Debian's package with `apt-get install -y chromium`"
            )
        })
}

/// What a browser run printed.
struct Run {
    stdout: String,
    stderr: String,
}

/// Runs headless Chromium with `args` in a fresh profile under `dir`,
/// killing it after [`TIMEOUT`].
fn run_browser(dir: &Path, name: &str, args: &[String]) -> Run {
    let profile = dir.join(format!("profile-{name}"));
    let (out_path, err_path) = (
        dir.join(format!("{name}.out")),
        dir.join(format!("{name}.err")),
    );
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
        ])
        .args(["--no-first-run", "--enable-logging=stderr", "--v=0"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).expect("stdout file"))
        .stderr(File::create(&err_path).expect("stderr file"))
        .spawn()
        .expect("chromium starts");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for chromium") {
            break status;
        }
        if started.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium ({name}) did not finish within {TIMEOUT:?}; killed");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let run = Run {
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
    };
    assert!(
        status.success(),
        "chromium ({name}) failed: {status}\n{}",
        run.stderr
    );
    run
}

/// The page's `file://` URL.
fn url(path: &Path) -> String {
    format!("file://{}", path.display())
}

/// Loads `page` at `width` with the checking script and returns its summary.
fn check(dir: &Path, page: &str, width: u32) -> Value {
    let path = dir.join(format!("check-{width}.html"));
    std::fs::write(
        &path,
        page.replace("</body>", &format!("{CHECK_SCRIPT}</body>")),
    )
    .expect("write page");
    let run = run_browser(
        dir,
        &format!("check-{width}"),
        &[
            format!("--window-size={width},900"),
            "--dump-dom".to_string(),
            url(&path),
        ],
    );
    let console: Vec<&str> = run
        .stderr
        .lines()
        .filter(|line| line.contains("CONSOLE") || line.contains("Uncaught"))
        .collect();
    assert!(
        console.is_empty(),
        "console output at {width} px: {console:#?}"
    );
    let start = run
        .stdout
        .find("<pre id=\"nvraid-check\">")
        .unwrap_or_else(|| {
            panic!(
                "no check summary at {width} px; the DOM was:\n{}",
                run.stdout
            )
        });
    let text = &run.stdout[start..];
    let text = &text[text.find('>').unwrap() + 1..text.find("</pre>").expect("summary closed")];
    let json = text
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("summary is not JSON ({e}): {json}"))
}

/// Each chart's SVG source in `page`, in page order, with its name.
fn chart_sources(page: &str) -> Vec<(String, &str)> {
    page.match_indices("<figure data-chart=\"")
        .map(|(start, marker)| {
            let rest = &page[start + marker.len()..];
            let name = rest[..rest.find('"').unwrap()].to_string();
            let end = rest.find("</figure>").unwrap();
            let svg_start = rest.find("<svg").unwrap();
            let svg_end = rest.find("</svg>").unwrap();
            assert!(svg_end < end, "{name}: the SVG is inside its figure");
            (name, &rest[svg_start..svg_end])
        })
        .collect()
}

/// Checks a summary against the page's charts: each drew, at a size,
/// every element its source has.
fn assert_charts_drawn(summary: &Value, page: &str, width: u32) {
    // Chromium may make the window wider than asked (500 px at least).
    let viewport = summary["viewport"].as_f64().expect("viewport width");
    assert_eq!(
        summary["errors"],
        Value::Array(vec![]),
        "script errors at {width} px"
    );
    let charts = summary["charts"].as_array().expect("charts");
    let sources = chart_sources(page);
    assert_eq!(
        charts.len(),
        sources.len(),
        "every chart was found at {width} px"
    );
    for (chart, (name, source)) in charts.iter().zip(&sources) {
        assert_eq!(chart["chart"].as_str(), Some(name.as_str()));
        let size = |key: &str| chart[key].as_f64().unwrap_or(0.0);
        assert!(
            size("width") > 100.0 && size("height") > 100.0,
            "{name} at {width} px: {chart}"
        );
        assert!(
            size("width") <= viewport,
            "{name} wider than the window at {width} px"
        );
        let content = &chart["content"];
        assert!(
            content[0].as_f64() > Some(0.0) && content[1].as_f64() > Some(0.0),
            "{name}"
        );
        for shape in SHAPES {
            let written = source.matches(&format!("<{shape} ")).count();
            let drawn = chart["drawn"][shape].as_u64().unwrap_or(0) as usize;
            assert_eq!(
                drawn, written,
                "{name} at {width} px: {shape}s drawn of those written"
            );
        }
        let shapes: u64 = ["rect", "polyline", "circle"]
            .iter()
            .map(|shape| chart["drawn"][shape].as_u64().unwrap_or(0))
            .sum();
        assert!(
            shapes > 10,
            "{name} at {width} px: only {shapes} shapes drawn"
        );
        assert_eq!(
            chart["outside"],
            Value::Array(vec![]),
            "{name} at {width} px: clipped text"
        );
    }
}

#[test]
fn every_chart_renders_in_chromium() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("browser");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let page = render_html(&common::all_fixtures(), "nvraid report").expect("page renders");
    let report = dir.join("report.html");
    std::fs::write(&report, &page).expect("write report");

    let wide = check(&dir, &page, WIDE);
    assert_charts_drawn(&wide, &page, WIDE);
    let narrow = check(&dir, &page, NARROW);
    assert_charts_drawn(&narrow, &page, NARROW);
    assert!(
        narrow["viewport"].as_f64() < Some(640.0),
        "the narrow window is narrow: {narrow}"
    );
    assert!(
        narrow["overflow"].as_f64() <= Some(0.0),
        "the page scrolls sideways at {NARROW} px"
    );

    let height = wide["height"]
        .as_u64()
        .expect("page height")
        .min(MAX_SHOT_HEIGHT);
    let shot = dir.join("report.png");
    run_browser(
        &dir,
        "screenshot",
        &[
            format!("--window-size={WIDE},{height}"),
            format!("--screenshot={}", shot.display()),
            url(&report),
        ],
    );
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(png.starts_with(b"\x89PNG"), "the screenshot is a PNG");
    let png_width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    assert_eq!(png_width, WIDE);
    if let Some(copy) = std::env::var_os("NVRAID_REPORT_SCREENSHOT") {
        std::fs::copy(&shot, &copy).expect("copy the screenshot");
    }
}
