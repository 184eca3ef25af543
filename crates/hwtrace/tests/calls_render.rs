//! The answers people look at, rendered: `hwtrace calls --flame` and a
//! page summarising `hwtrace timeline`'s tracks are opened in headless
//! Chromium, and the screenshots must show a picture (many colours, most
//! of the page not background). Plus the command line's own promises on
//! the real trace `../shared/corpus/real/foo` (117,967 instructions):
//! folded stacks count every instruction once, the call trace, JSON lines
//! and report agree, and no progress bar is drawn when stderr is not a
//! terminal.
//!
//! Needs Debian's `chromium` (`scripts/setup.sh`).

use anyhow::{Context, Result, ensure};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The real trace and its page cache.
fn foo() -> (String, String) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/real/foo");
    (
        dir.join("trace.pt").display().to_string(),
        dir.display().to_string(),
    )
}

/// Instructions in the foo trace (libipt's ptxed and Linux perf agree).
const FOO_INSNS: u64 = 117_967;

const CHROMIUM: &str = "/usr/bin/chromium";

/// A scratch folder, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Result<Self> {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "hwtrace-calls-render-{}-{n}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(Scratch(dir))
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs hwtrace; its stdout and stderr, which must be a success.
fn hwtrace(args: &[&str]) -> Result<(String, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .args(args)
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(out.status.success(), "hwtrace {args:?}: {stderr}");
    Ok((String::from_utf8(out.stdout)?, stderr))
}

/// Screenshots `page` with headless Chromium into `png`.
fn screenshot(page: &Path, png: &Path, profile: &Path) -> Result<()> {
    ensure!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} missing: install Debian's chromium (scripts/setup.sh)"
    );
    let out = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", png.display()))
        .arg("--window-size=1200,800")
        .arg(format!("file://{}", page.display()))
        .output()
        .context("running chromium")?;
    ensure!(
        out.status.success() && png.exists(),
        "chromium: {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Decodes a PNG: (distinct colours, share of pixels that are not the
/// most common colour).
fn picture(png: &Path) -> Result<(usize, f64)> {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(png)?));
    let mut reader = decoder.read_info()?;
    let mut buf = vec![0; reader.output_buffer_size().context("PNG too large")?];
    let info = reader.next_frame(&mut buf)?;
    let channels = info.color_type.samples();
    ensure!(
        info.bit_depth == png::BitDepth::Eight && channels >= 3,
        "unexpected PNG format {:?} {:?}",
        info.color_type,
        info.bit_depth
    );
    let pixels = &buf[..info.buffer_size()];
    let mut counts: std::collections::HashMap<[u8; 3], usize> = std::collections::HashMap::new();
    for px in pixels.chunks_exact(channels) {
        *counts.entry([px[0], px[1], px[2]]).or_default() += 1;
    }
    let total = pixels.len() / channels;
    let background = counts.values().copied().max().unwrap_or(0);
    Ok((counts.len(), 1.0 - background as f64 / total as f64))
}

#[test]
fn the_flame_graph_renders_in_chromium() -> Result<()> {
    let (trace, pages) = foo();
    let dir = Scratch::new("flame")?;
    let svg = dir.path("flame.svg");
    let folded = dir.path("stacks.folded");
    let svg_arg = svg.display().to_string();
    let folded_arg = folded.display().to_string();
    hwtrace(&[
        "calls",
        &trace,
        "--pages",
        &pages,
        "--flame",
        &svg_arg,
        "--folded",
        &folded_arg,
    ])?;
    // Every instruction is counted once, in exactly one stack.
    let total: u64 = std::fs::read_to_string(&folded)?
        .lines()
        .map(|l| l.rsplit_once(' ').and_then(|(_, n)| n.parse::<u64>().ok()))
        .sum::<Option<u64>>()
        .context("a folded line without a count")?;
    ensure!(total == FOO_INSNS, "folded stacks count {total}");

    let png = dir.path("flame.png");
    screenshot(&svg, &png, &dir.path("profile"))?;
    let (colours, drawn) = picture(&png)?;
    eprintln!(
        "flame graph: {colours} colours, {:.0}% drawn",
        drawn * 100.0
    );
    ensure!(colours > 50, "only {colours} colours: blank?");
    ensure!(drawn > 0.05, "only {:.1}% of the page drawn", drawn * 100.0);
    Ok(())
}

/// A page that reads the timeline JSON and shows its track summary: one
/// row per track (its thread name, slices, depth, span) with the slices
/// drawn as bars by depth.
fn summary_page(json: &str) -> String {
    // `</` cannot end the script element early once escaped; `<\/` is the
    // same JSON string.
    let data = json.replace("</", "<\\/");
    format!(
        r#"<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>timeline tracks</title>
<style>body{{font:14px sans-serif;margin:16px}} td,th{{padding:2px 10px;border-bottom:1px solid #ccc}}</style>
</head><body>
<h1 id="title">timeline</h1>
<table id="tracks"><tr><th>track</th><th>slices</th><th>depth</th><th>span (µs)</th></tr></table>
<canvas id="bars" width="1150" height="400"></canvas>
<script type="application/json" id="trace">{data}</script>
<script>
const doc = JSON.parse(document.getElementById('trace').textContent);
const names = {{}}, tracks = {{}};
for (const e of doc.traceEvents) {{
  const key = e.pid + '/' + e.tid;
  if (e.ph === 'M' && e.name === 'thread_name') names[key] = e.args.name;
  if (e.ph !== 'X') continue;
  (tracks[key] = tracks[key] || []).push(e);
}}
document.getElementById('title').textContent =
  Object.keys(tracks).length + ' track(s), clock: ' + doc.otherData.clock;
const table = document.getElementById('tracks');
const ctx = document.getElementById('bars').getContext('2d');
let row = 0;
for (const [key, list] of Object.entries(tracks)) {{
  list.sort((a, b) => a.ts - b.ts || b.dur - a.dur);
  const start = list[0].ts;
  const end = Math.max(...list.map(e => e.ts + e.dur));
  const open = [];
  let depth = 0;
  for (const e of list) {{
    while (open.length && open[open.length - 1] <= e.ts && open.length) open.pop();
    e.depth = open.length;
    open.push(e.ts + e.dur);
    depth = Math.max(depth, e.depth + 1);
  }}
  const tr = table.insertRow();
  for (const v of [names[key] || key, list.length, depth, (end - start).toFixed(3)])
    tr.insertCell().textContent = v;
  const scale = 1150 / Math.max(end - start, 1);
  for (const e of list) {{
    let h = 0;
    for (const c of e.name) h = (h * 31 + c.charCodeAt(0)) >>> 0;
    ctx.fillStyle = 'hsl(' + (h % 360) + ',70%,' + (40 + h % 30) + '%)';
    ctx.fillRect((e.ts - start) * scale, row * 200 + e.depth * 12,
                 Math.max(e.dur * scale, 1), 11);
  }}
  row++;
}}
</script></body></html>
"#
    )
}

#[test]
fn the_timeline_track_summary_renders_in_chromium() -> Result<()> {
    let (trace, pages) = foo();
    let dir = Scratch::new("timeline")?;
    let json = dir.path("timeline.json");
    let json_arg = json.display().to_string();
    hwtrace(&["timeline", &trace, "--pages", &pages, "-o", &json_arg])?;
    let text = std::fs::read_to_string(&json)?;
    let doc: serde_json::Value = serde_json::from_str(&text)?;
    let events = doc["traceEvents"].as_array().context("traceEvents")?;
    let slices = events.iter().filter(|e| e["ph"] == "X").count();
    ensure!(slices > 1000, "{slices} slices");
    ensure!(
        events
            .iter()
            .all(|e| e["ph"].is_string() && e["pid"].is_u64() && e["name"].is_string()),
        "an event lacks ph, pid or name"
    );
    ensure!(
        events
            .iter()
            .filter(|e| e["ph"] != "M")
            .all(|e| e["ts"].is_number() && e["tid"].is_u64()),
        "an event lacks ts or tid"
    );

    let page = dir.path("tracks.html");
    std::fs::write(&page, summary_page(&text))?;
    let png = dir.path("tracks.png");
    screenshot(&page, &png, &dir.path("profile"))?;
    let (colours, drawn) = picture(&png)?;
    eprintln!(
        "track summary: {colours} colours, {:.0}% drawn",
        drawn * 100.0
    );
    ensure!(colours > 50, "only {colours} colours: blank?");
    ensure!(drawn > 0.05, "only {:.1}% of the page drawn", drawn * 100.0);
    Ok(())
}

/// The call trace, the JSON lines and the report tell the same story;
/// stderr (a pipe here) gets no progress bar.
#[test]
fn tree_json_and_report_agree_without_a_progress_bar() -> Result<()> {
    let (trace, pages) = foo();
    let (tree, err_tree) = hwtrace(&["calls", &trace, "--pages", &pages])?;
    let (json, err_json) = hwtrace(&["calls", &trace, "--pages", &pages, "--json"])?;
    let (report, err_report) = hwtrace(&["report", &trace, "--pages", &pages, "--top", "3"])?;
    for err in [&err_tree, &err_json, &err_report] {
        ensure!(err.is_empty(), "stderr is not a terminal, yet: {err:?}");
    }
    let events: Vec<serde_json::Value> = json
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let enters = events.iter().filter(|e| e["event"] == "enter").count();
    // Each function the trace shows being called is one tree line that
    // is either a leaf (`name  N insns`) or opens (`name {`).
    let tree_frames = tree
        .lines()
        .filter(|l| !l.trim_start().starts_with('}') && !l.starts_with('['))
        .count();
    let begins = events
        .iter()
        .filter(|e| e["event"] == "begin" || e["event"] == "caller")
        .count();
    ensure!(
        tree_frames == enters + begins,
        "{tree_frames} tree frames, {enters} entries + {begins} begins"
    );
    // The outermost frames hold every instruction.
    let outer: u64 = events
        .iter()
        .filter(|e| e["event"] == "exit" && e["depth"] == 0)
        .filter_map(|e| e["insns"].as_u64())
        .sum();
    ensure!(
        outer == FOO_INSNS,
        "outermost frames hold {outer} instructions"
    );
    ensure!(
        report.contains(&format!("instructions     {FOO_INSNS}")),
        "{report}"
    );
    // The threads table: `insns%  insns  calls  depth  thread`.
    let thread: Vec<&str> = report
        .lines()
        .skip_while(|l| *l != "threads")
        .nth(2)
        .context("no thread row")?
        .split_whitespace()
        .collect();
    ensure!(
        thread.get(1) == Some(&&*FOO_INSNS.to_string())
            && thread.get(2) == Some(&&*enters.to_string())
            && thread.get(4) == Some(&"trace"),
        "thread row {thread:?}, {enters} entries"
    );
    let functions: HashSet<&str> = events
        .iter()
        .filter_map(|e| e["function"].as_str())
        .collect();
    ensure!(
        report.contains(&format!("functions        {}", functions.len())),
        "{} functions in the JSON lines:\n{report}",
        functions.len()
    );
    Ok(())
}

/// On a terminal (a pseudo-terminal made by util-linux's `script`) the
/// progress bar is drawn on stderr: the file's name, bytes read of the
/// total and the time left; `--quiet` draws nothing.
#[test]
fn the_progress_bar_is_drawn_on_a_terminal_unless_quiet() -> Result<()> {
    ensure!(
        Path::new("/usr/bin/script").exists(),
        "/usr/bin/script missing: install Debian's bsdutils"
    );
    let (trace, pages) = foo();
    let dir = Scratch::new("progress")?;
    let out = dir.path("timeline.json");
    let on_terminal = |extra: &str| -> Result<String> {
        let command = format!(
            "{} timeline {trace} --pages {pages} -o {} {extra}",
            env!("CARGO_BIN_EXE_hwtrace"),
            out.display()
        );
        let run = Command::new("/usr/bin/script")
            .args(["-q", "-e", "-c", &command, "/dev/null"])
            .output()?;
        ensure!(run.status.success(), "{command}: {:?}", run.status);
        Ok(String::from_utf8_lossy(&run.stdout).into_owned())
    };
    let shown = on_terminal("")?;
    ensure!(
        shown.contains("trace.pt [") && shown.contains("KiB") && shown.contains("left)"),
        "no progress bar on a terminal: {shown:?}"
    );
    let quiet = on_terminal("--quiet")?;
    ensure!(
        !quiet.contains("trace.pt [") && !quiet.contains("left)"),
        "--quiet still drew: {quiet:?}"
    );
    Ok(())
}
