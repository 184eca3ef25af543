//! libipt's sideband scenarios (`../shared/corpus/libipt/pevent-*`): every
//! `.sb` file parses, and the session prints the sideband lines of each
//! case's `-ptdump.exp` (whitespace-normalised, as libipt's `diff -ub`), in
//! the same places relative to the trace's `tsc` packets.

use std::fs;
use std::path::{Path, PathBuf};

use hwtrace_perf::pevent::{
    LocationHint, RecordReader, Session, SidebandOptions, TraceEvent, split_file_arg,
};
use hwtrace_types::{Ip, Tsc};
use serde_json::Value;

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/libipt")
}

fn cases() -> Vec<PathBuf> {
    let mut dirs: Vec<_> = fs::read_dir(corpus())
        .expect("corpus at ../shared/corpus")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("pevent-"))
        })
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 12, "expected the 12 pevent cases");
    dirs
}

fn strings(case: &Value, key: &str) -> Vec<String> {
    case[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

/// A session configured from `options` then the case's sideband arguments,
/// the files read from the case folder but named as on the command line.
fn session(dir: &Path, options: &[String]) -> Session {
    let case: Value = serde_json::from_slice(&fs::read(dir.join("case.json")).unwrap()).unwrap();
    let mut opts = SidebandOptions::default();
    let args: Vec<String> = options
        .iter()
        .cloned()
        .chain(strings(&case, "sideband_arguments"))
        .collect();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        // Non-sideband options (e.g. ptxed's --event:tick) are not ours.
        let _ = opts.parse_arg(&arg, &mut || it.next()).unwrap();
    }
    let mut session = Session::new(opts.output);
    for (arg, config) in opts.files {
        let (name, range) = split_file_arg(&arg).unwrap();
        assert_eq!(range.begin, 0);
        let data = fs::read(dir.join(name)).unwrap();
        session.add_buffer(name, data, config);
    }
    session
}

fn normalise(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect()
}

fn exp_file(dir: &Path, suffix: &str) -> Option<String> {
    let name = dir.file_name()?.to_str()?.to_owned();
    fs::read_to_string(dir.join(format!("{name}{suffix}"))).ok()
}

#[test]
fn every_sideband_file_parses_to_its_end() {
    for dir in cases() {
        let case: Value =
            serde_json::from_slice(&fs::read(dir.join("case.json")).unwrap()).unwrap();
        let args = strings(&case, "sideband_arguments");
        let mut sample_type = 0;
        for pair in args.windows(2) {
            match pair[0].as_str() {
                "--pevent:sample-type" => {
                    sample_type = u64::from_str_radix(pair[1].trim_start_matches("0x"), 16).unwrap()
                }
                "--pevent:primary" | "--pevent:secondary" => {
                    let bytes = fs::read(dir.join(&pair[1])).unwrap();
                    let mut reader = RecordReader::new(&bytes, sample_type);
                    let mut count = 0;
                    while let Some(record) = reader.next_record().unwrap_or_else(|e| {
                        panic!("{}: {e}", pair[1]);
                    }) {
                        assert_eq!(record.raw.len(), usize::from(record.header.size));
                        count += 1;
                    }
                    assert_eq!(reader.offset().0 as usize, bytes.len(), "{}", pair[1]);
                    assert!(count > 0, "{}", pair[1]);
                }
                _ => {}
            }
        }
    }
}

/// The expected sideband lines of a ptdump listing, split at each `tsc`
/// packet: `(lines before the packet, its value)`, and the lines after the
/// last one.
fn ptdump_segments(exp: &str) -> (Vec<(Vec<String>, u64)>, Vec<String>) {
    let mut segments = Vec::new();
    let mut current = Vec::new();
    let mut in_record = false;
    for line in normalise(exp) {
        let tokens: Vec<&str> = line.split(' ').collect();
        if line.contains("PERF_RECORD_") || line.contains("UNKNOWN") {
            in_record = true;
            current.push(line);
        } else if in_record && !looks_like_offset(tokens[0]) {
            // A verbose record's field line.
            current.push(line);
        } else {
            in_record = false;
            if tokens.get(1) == Some(&"tsc") {
                let value = u64::from_str_radix(tokens[2], 16).unwrap();
                segments.push((std::mem::take(&mut current), value));
            }
        }
    }
    (segments, current)
}

fn looks_like_offset(token: &str) -> bool {
    token.len() == 16 && token.chars().all(|c| c.is_ascii_hexdigit())
}

#[test]
fn ptdump_sideband_lines_match() {
    let (mut checked, mut lines) = (0, 0);
    for dir in cases() {
        let case: Value =
            serde_json::from_slice(&fs::read(dir.join("case.json")).unwrap()).unwrap();
        let exp = exp_file(&dir, "-ptdump.exp").unwrap();
        let (segments, rest) = ptdump_segments(&exp);
        let mut session = session(&dir, &strings(&case, "ptdump_options"));
        let mut start = Vec::new();
        session.start(&mut start).unwrap();
        assert!(start.is_empty(), "{}", dir.display());
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        for (i, (expected, tsc)) in segments.iter().enumerate() {
            let mut out = Vec::new();
            session.dump_due(Tsc(*tsc), &mut out).unwrap();
            assert_eq!(
                &normalise(&String::from_utf8(out).unwrap()),
                expected,
                "{name}: before tsc packet #{i} ({tsc:x})"
            );
            lines += expected.len();
        }
        let mut out = Vec::new();
        session.dump_rest(&mut out).unwrap();
        assert_eq!(
            normalise(&String::from_utf8(out).unwrap()),
            rest,
            "{name}: at the end"
        );
        lines += rest.len();
        checked += 1;
    }
    assert!(checked >= 12);
    // 70 record lines plus 135 verbose field lines in the corpus.
    assert_eq!(lines, 205);
}

/// The lines of a ptxed listing the sideband session produces.
fn ptxed_sideband_lines(exp: &str) -> Vec<String> {
    normalise(exp)
        .into_iter()
        .filter(|l| {
            l.contains("PERF_RECORD_") || l.contains(" sideband ") || l.starts_with("[context:")
        })
        .collect()
}

fn run_events(dir: &Path, events: &[TraceEvent]) -> Vec<String> {
    let case: Value = serde_json::from_slice(&fs::read(dir.join("case.json")).unwrap()).unwrap();
    let mut session = session(dir, &strings(&case, "ptxed_options"));
    let mut out = Vec::new();
    for &event in events {
        session.apply_event(event, &mut out).unwrap();
    }
    normalise(&String::from_utf8(out).unwrap())
}

fn ev(tsc: u64, hint: LocationHint) -> TraceEvent {
    TraceEvent {
        tsc: Tsc(tsc),
        hint,
    }
}

#[test]
fn ptxed_warnings_match() {
    let dir = corpus().join("pevent-warn");
    let exp = exp_file(&dir, "-ptxed.exp").unwrap();
    // The trace is enabled at 0x1000 with TSC 1; all records are due then.
    let got = run_events(
        &dir,
        &[
            ev(1, LocationHint::Ip(Ip(0x1000))),
            ev(1, LocationHint::DisabledSuppressed),
        ],
    );
    assert_eq!(got, ptxed_sideband_lines(&exp));
}

#[test]
fn ptxed_context_switches_match() {
    // pevent-tip_pgd-switch-tsc-tip_pge: enabled at 0x1000 (TSC 1), disabled
    // with the IP suppressed, enabled again at 0x2000 (TSC 4).
    let dir = corpus().join("pevent-tip_pgd-switch-tsc-tip_pge");
    let exp = exp_file(&dir, "-ptxed.exp").unwrap();
    let got = run_events(
        &dir,
        &[
            ev(1, LocationHint::Ip(Ip(0x1000))),
            ev(1, LocationHint::DisabledSuppressed),
            ev(4, LocationHint::Ip(Ip(0x2000))),
        ],
    );
    assert_eq!(got, ptxed_sideband_lines(&exp));
}

#[test]
fn ptxed_record_lines_match_in_order() {
    // Without the flow decoder: presenting one late event applies every
    // record; the record lines must come out in the listing's order.
    let mut checked = 0;
    for dir in cases() {
        let Some(exp) = exp_file(&dir, "-ptxed.exp") else {
            continue;
        };
        let expected: Vec<String> = normalise(&exp)
            .into_iter()
            .filter(|l| l.contains("PERF_RECORD_"))
            .collect();
        let got: Vec<String> = run_events(&dir, &[ev(u64::MAX, LocationHint::None)])
            .into_iter()
            .filter(|l| l.contains("PERF_RECORD_"))
            .collect();
        assert_eq!(got, expected, "{}", dir.display());
        checked += 1;
    }
    assert!(checked >= 10);
}
