//! libipt's instruction and block decoders through our bindings: the real `foo` trace over its
//! page cache reproduces the reference ptxed output, and libipt corpus cases decoded over their
//! raw images (files, plain and through a section cache) give ptxed's instruction addresses.

mod common;

use common::{corpus, json_string, json_strings, read, read_text};
use hwtrace_libipt::{
    Config, Image, InsnItem, OracleEventKind, Sections, count_blocks, count_insns, insn_addresses,
    insn_trace,
};

const PAGE: usize = 4096;

/// The `foo` page cache: `pages.addr` holds one little-endian u64 virtual address per 4 KiB
/// page of `pages.dump`; an address with low 12 bits set marks a page that was not mapped.
/// Runs of consecutive pages become one section, so instructions may straddle pages.
fn page_sections<'a>(addrs: &[u8], dump: &'a [u8]) -> Sections<'a> {
    assert_eq!(addrs.len() % 8, 0);
    assert_eq!(
        dump.len(),
        addrs.len() / 8 * PAGE,
        "pages.dump size != pages × 4 KiB"
    );
    // (virtual address, dump start, dump end) of each run of consecutive pages.
    let mut runs: Vec<(u64, usize, usize)> = Vec::new();
    for (i, chunk) in addrs.chunks_exact(8).enumerate() {
        let addr = u64::from_le_bytes(chunk.try_into().unwrap());
        if addr & 0xfff != 0 {
            continue;
        }
        let at = i * PAGE;
        match runs.last_mut() {
            Some((va, start, end)) if *end == at && *va + (*end - *start) as u64 == addr => {
                *end += PAGE;
            }
            _ => runs.push((addr, at, at + PAGE)),
        }
    }
    let mut sections = Sections::new();
    for (addr, start, end) in runs {
        sections.insert(addr, &dump[start..end]).unwrap();
    }
    sections
}

/// ptxed's line for an item, for the events ptxed prints without `--event:*` options; `None`
/// for what ptxed does not print by default: status updates (the state a PSB+ restates: TSX,
/// paging, VMCS, CBR) and an execution mode that did not change (`mode` tracks it).
fn ptxed_line(item: &InsnItem, mode: &mut Option<u8>) -> Option<String> {
    if let InsnItem::Event(e) = item {
        if e.status_update {
            return None;
        }
        if let OracleEventKind::ExecMode { mode: new, .. } = e.kind
            && mode.replace(new) == Some(new)
        {
            return None;
        }
    }
    Some(match item {
        InsnItem::Insn(ip) => format!("{ip:016x}"),
        InsnItem::Event(e) => match e.kind {
            OracleEventKind::Enabled { resumed: false, .. } => "[enabled]".into(),
            OracleEventKind::Enabled { resumed: true, .. } => "[resumed]".into(),
            OracleEventKind::Disabled { .. } | OracleEventKind::AsyncDisabled { .. } => {
                "[disabled]".into()
            }
            OracleEventKind::ExecMode { mode: 3, .. } => "[exec mode: 64-bit]".into(),
            other => format!("[unexpected event {other:?}]"),
        },
        InsnItem::Error(e) => format!("[error {e}]"),
    })
}

#[test]
fn real_trace_foo_matches_reference_ptxed() {
    let dir = corpus().join("real/foo");
    let trace = read(&dir.join("trace.pt"));
    let addrs = read(&dir.join("pages.addr"));
    let dump = read(&dir.join("pages.dump"));
    let sections = page_sections(&addrs, &dump);
    let image = Image::with_memory(&sections).unwrap();
    let cfg = Config::default();

    let items = insn_trace(&trace, &cfg, &image).unwrap();
    let mut mode = None;
    let got: Vec<String> = items
        .iter()
        .filter_map(|i| ptxed_line(i, &mut mode))
        .collect();
    let expected = read_text(&dir.join("reference/ptxed-insn.txt"));
    let expected: Vec<&str> = expected.lines().collect();
    for (n, (have, want)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(have, want, "reference/ptxed-insn.txt line {}", n + 1);
    }
    assert_eq!(
        got.len(),
        expected.len(),
        "line count differs from reference/ptxed-insn.txt"
    );

    // The same instructions as perf saw (reference/perf-insn.txt: bare hex, one per line).
    let (ips, errors) = insn_addresses(&trace, &cfg, &image).unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    let perf = read_text(&dir.join("reference/perf-insn.txt"));
    let perf: Vec<u64> = perf
        .lines()
        .map(|l| u64::from_str_radix(l.trim(), 16).unwrap())
        .collect();
    assert_eq!(ips.len(), 117_967);
    assert!(
        ips == perf,
        "instruction addresses differ from reference/perf-insn.txt"
    );

    // The benchmark loops agree with the collecting decoder.
    assert_eq!(count_insns(&trace, &cfg, &image), Ok((117_967, 0)));
    let blocks = count_blocks(&trace, &cfg, &image).unwrap();
    assert_eq!((blocks.insns, blocks.errors), (117_967, 0));
    assert!(blocks.blocks > 0 && blocks.blocks < blocks.insns);
}

#[test]
fn missing_code_is_reported_with_its_trace_offset() {
    let dir = corpus().join("real/foo");
    let trace = read(&dir.join("trace.pt"));
    let nothing = |_: u64, _: &mut [u8]| 0usize;
    let image = Image::with_memory(&nothing).unwrap();
    let (ips, errors) = insn_addresses(&trace, &Config::default(), &image).unwrap();
    assert!(
        ips.is_empty(),
        "decoded {} instructions from an empty image",
        ips.len()
    );
    assert!(!errors.is_empty());
    // libipt resyncs at each PSB after the failure; offsets are inside the trace and ordered.
    assert!(
        errors
            .iter()
            .all(|e| e.message == "no memory mapped at this address"),
        "{errors:?}"
    );
    assert!(errors.windows(2).all(|w| w[0].offset < w[1].offset));
    assert!(errors.iter().all(|e| e.offset < trace.len() as u64));
}

/// `"file": "…"` / `"load_address": "0x…"` pairs of a case's `images`.
fn images(case: &str) -> Vec<(String, u64)> {
    let files = case
        .split("\"file\":")
        .skip(1)
        .filter_map(|s| json_string(&format!("\"f\":{s}"), "f"));
    let loads = case
        .split("\"load_address\":")
        .skip(1)
        .filter_map(|s| json_string(&format!("\"l\":{s}"), "l"));
    files
        .zip(loads)
        .map(|(f, l)| {
            (
                f,
                u64::from_str_radix(l.trim_start_matches("0x"), 16).unwrap(),
            )
        })
        .collect()
}

/// Packets libipt 2.0.5 does not know (event trace and triggers came later).
const NEWER_PACKETS: [&str; 6] = ["cfe", "evd", "trig", "bbp", "bip", "bep"];

/// Whether the case's ptdump expectation shows a packet libipt 2.0.5 cannot decode.
fn uses_newer_packets(dir: &std::path::Path, case: &str) -> bool {
    json_strings(case, "dump").iter().any(|exp| {
        read_text(&dir.join(exp)).lines().any(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|name| NEWER_PACKETS.contains(&name))
        })
    })
}

/// Cases where libipt 2.0.5's instruction decoder differs from the newer libipt that wrote the
/// expectations; each must still differ so the list cannot go stale.
const KNOWN_DIFFERENT: [(&str, &str); 5] = [
    (
        "int-eretu",
        "ERETU (FRED) is unknown to 2.0.5's instruction decoder",
    ),
    (
        "int-eretu-cpl_0",
        "ERETU (FRED) is unknown to 2.0.5's instruction decoder",
    ),
    (
        "tip-jmpabs",
        "JMPABS (APX) is unknown to 2.0.5's instruction decoder",
    ),
    (
        "tip_pgd-jmpabs",
        "JMPABS (APX) is unknown to 2.0.5's instruction decoder",
    ),
    (
        "tip_pgd-mwait-pwre-exstop-pwrx-tip_pge",
        "2.0.5 runs past the final FUP+TIP.PGD (async disable at 0x1004) to 0x1005",
    ),
];

/// Instruction addresses of ptxed expectations in the libipt corpus, for cases ptxed runs with
/// no options, no CPU and no sideband. Images alternate between `pt_image_add_file` and the
/// section-cache path so both are exercised. Events and errors are not compared: their lines
/// depend on ptxed's printing options and on libipt's version.
#[test]
fn libipt_corpus_ptxed_instruction_addresses() {
    let root = corpus().join("libipt");
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    dirs.sort();
    let (mut compared, mut skipped, mut failures) = (0, 0, Vec::new());
    for (n, dir) in dirs.iter().enumerate() {
        let case = read_text(&dir.join("case.json"));
        let plain = json_strings(&case, "ptxed_options").is_empty()
            && json_strings(&case, "sideband_arguments").is_empty()
            && json_string(&case, "cpu").is_none();
        let Some(exp) = json_strings(&case, "flow").into_iter().next() else {
            continue;
        };
        if !plain || uses_newer_packets(dir, &case) {
            skipped += 1;
            continue;
        }
        let mut image = Image::new().unwrap();
        for (file, addr) in images(&case) {
            let path = dir.join(file);
            let size = std::fs::metadata(&path).unwrap().len();
            let added = if n % 2 == 0 {
                image.add_file(&path, 0, size, addr)
            } else {
                image.add_file_cached(&path, 0, size, addr)
            };
            added.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
        let trace = read(&dir.join(json_string(&case, "trace").unwrap()));
        let (ips, _errors) = insn_addresses(&trace, &Config::default(), &image).unwrap();
        let want: Vec<u64> = read_text(&dir.join(exp))
            .lines()
            // Speculative instructions (inside a transaction) are prefixed with "? ".
            .map(|l| l.strip_prefix("? ").unwrap_or(l))
            .filter(|l| l.len() == 16 && l.bytes().all(|b| b.is_ascii_hexdigit()))
            .map(|l| u64::from_str_radix(l, 16).unwrap())
            .collect();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let known = KNOWN_DIFFERENT.iter().any(|(k, _)| *k == name);
        if known {
            if ips == want {
                failures.push(format!("{name}: listed in KNOWN_DIFFERENT but now matches"));
            }
        } else if ips != want {
            failures.push(format!(
                "{}: got {:x?}, want {:x?}",
                dir.display(),
                ips,
                want
            ));
        }
        compared += 1;
    }
    eprintln!(
        "ptxed corpus: {compared} cases compared, {skipped} skipped (options, cpu, sideband or post-2.0.5 packets)"
    );
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(compared > 90, "only {compared} cases compared");
}
