//! libipt's packet decoder, through our bindings, reproduces libipt's own ptdump output:
//! on a real hardware trace and on the libipt test corpus. This pins the hand-written
//! `struct pt_packet` layout (every payload field is printed and compared).

mod common;

use common::{corpus, json_string, json_strings, read, read_text, tokens};
use hwtrace_libipt::{
    Config, Cpu, OracleError, OraclePacket, Stage, SyncMode, count_packets, packets,
};

/// Our rendering of one decoded item in ptdump's format.
fn render(item: &Result<OraclePacket, OracleError>) -> String {
    match item {
        Ok(p) => format!("{:016x}  {}", p.offset, p.kind),
        Err(e) => e.ptdump_line(),
    }
}

/// Tokens of an expected ptdump line, minus what libipt 2.0.5's packet decoder cannot report:
/// - ptdump's CR3/VMCS tracking column after `pip`/`vmcs` packets (`cr3 000…`, `vmcs 000…`),
///   which is decoder state, not packet payload;
/// - the MODE.Exec IF bit (`if`), which 2.0.5's `struct pt_packet_mode_exec` does not have.
fn expected_tokens(line: &str) -> Vec<String> {
    let mut t = tokens(line);
    if t.len() > 2
        && (t[1] == "pip" || t[1] == "vmcs")
        && let Some(at) = (3..t.len()).find(|&i| t[i] == "cr3" || t[i] == "vmcs")
    {
        t.truncate(at);
    }
    if t.len() > 2 && t[1] == "mode.exec" && t.last().is_some_and(|s| s == "if") {
        t.pop();
        if let Some(last) = t.last_mut() {
            *last = last.trim_end_matches(',').to_owned();
        }
    }
    t
}

#[test]
fn real_trace_foo_matches_reference_ptdump() {
    let dir = corpus().join("real/foo");
    let trace = read(&dir.join("trace.pt"));
    let expected = read_text(&dir.join("reference/ptdump.txt"));
    let got = packets(&trace, &Config::default());

    assert!(
        got.iter().all(Result::is_ok),
        "libipt reported errors on foo"
    );
    let expected: Vec<&str> = expected.lines().collect();
    assert_eq!(
        got.len(),
        expected.len(),
        "packet count differs from reference/ptdump.txt"
    );
    for (n, (item, want)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(
            tokens(&render(item)),
            expected_tokens(want),
            "line {}",
            n + 1
        );
    }

    let count = |name: &str| {
        got.iter()
            .filter(|p| p.as_ref().is_ok_and(|p| p.kind.name() == name))
            .count()
    };
    // Counted from reference/ptdump.txt with `awk '{print $2}' | sort | uniq -c`.
    assert_eq!(count("psb"), 15);
    assert_eq!(count("tnt.8"), 5156);
    assert_eq!(count("tip"), 2346);
    assert_eq!(count("tip.pge"), 705);
    assert_eq!(count("tip.pgd"), 705);
    assert_eq!(count("pad"), 7014);
    assert_eq!(count_packets(&trace, &Config::default()), Ok((16044, 0)));

    // Packet sizes tile the trace from the first PSB to the end.
    let ok: Vec<&OraclePacket> = got.iter().map(|p| p.as_ref().unwrap()).collect();
    for pair in ok.windows(2) {
        assert_eq!(pair[0].offset + u64::from(pair[0].size), pair[1].offset);
    }
    let last = ok.last().unwrap();
    assert_eq!(last.offset + u64::from(last.size), trace.len() as u64);
}

/// Cases where libipt 2.0.5's packet decoder knowingly differs from the (newer) libipt that
/// wrote the corpus expectations. Each must still differ, so the list cannot go stale.
/// - skd007: the SKD007 workaround (a CYC overlapping an OVF) moved into the packet decoder
///   after 2.0.5; 2.0.5 applies it in the query decoder only, so ptdump 2.0.5 shows the CYC.
const KNOWN_DIFFERENT: [&str; 1] = ["skd007@"];

/// Packets libipt 2.0.5 does not know (added in later libipt versions).
const NEWER_PACKETS: [&str; 6] = ["cfe", "evd", "trig", "bbp", "bip", "bep"];

/// Every libipt corpus case whose ptdump run needs no options beyond `--cpu` (from the case's
/// `cpu` field) and `--no-sync`: the dump must match the case's expectation line by line.
///
/// Cases with packets libipt 2.0.5 does not know (CFE, EVD, TRIG, BBP/BIP/BEP — the corpus is
/// from a newer libipt) are compared up to the first such packet, where 2.0.5 must report a
/// decode error at exactly that offset; the rest of those cases is skipped. Cases with timing,
/// sideband, `--lastip`, `--exec-mode`, `--raw` or `--no-offset` output are skipped: those print
/// decoder state, which is not what these bindings expose.
#[test]
fn libipt_corpus_ptdump_expectations() {
    let root = corpus().join("libipt");
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("reading {}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .collect();
    dirs.sort();

    let (mut full, mut prefix, mut skipped, mut unknown_cpu, mut known_diff) = (0, 0, 0, 0, 0);
    let mut failures = Vec::new();
    for dir in &dirs {
        let case = read_text(&dir.join("case.json"));
        let options = json_strings(&case, "ptdump_options");
        if options.iter().any(|o| o != "--no-sync") {
            skipped += 1;
            continue;
        }
        let mut cfg = Config::default();
        if options.iter().any(|o| o == "--no-sync") {
            cfg.sync = SyncMode::AssumeAtStart;
        }
        if let Some(cpu) = json_string(&case, "cpu") {
            let (family, model) = cpu.split_once('/').expect("cpu is F/M");
            cfg.cpu = Some(Cpu {
                family: family.parse().unwrap(),
                model: model.parse().unwrap(),
                stepping: 0,
            });
        }
        let trace = read(&dir.join(json_string(&case, "trace").expect("case has a trace")));
        let exp_name = json_strings(&case, "dump")
            .into_iter()
            .next()
            .expect("case has a dump expectation");
        let expected = read_text(&dir.join(&exp_name));
        let decoded = packets(&trace, &cfg);
        // Newer CPUs than 2.0.5 knows: pt_cpu_errata fails, so its errata cannot be applied.
        if let [Err(e)] = decoded.as_slice()
            && e.stage == Stage::Setup
            && e.message == "unknown cpu"
        {
            unknown_cpu += 1;
            continue;
        }
        let got: Vec<String> = decoded.iter().map(render).collect();

        let newer = expected.lines().position(|l| {
            tokens(l)
                .get(1)
                .is_some_and(|n| NEWER_PACKETS.contains(&n.as_str()))
        });
        let compared: Vec<&str> = expected.lines().take(newer.unwrap_or(usize::MAX)).collect();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let expect_diff = KNOWN_DIFFERENT.iter().any(|k| name.starts_with(k));
        let mismatch = compared.iter().enumerate().find_map(|(i, want)| {
            let have = got.get(i).map(String::as_str).unwrap_or("<missing>");
            (tokens(have) != expected_tokens(want))
                .then(|| format!("{name}: line {}: want `{want}`, got `{have}`", i + 1))
        });
        match (mismatch, expect_diff) {
            (Some(_), true) => {
                known_diff += 1;
                continue;
            }
            (None, true) => {
                failures.push(format!("{name}: listed in KNOWN_DIFFERENT but now matches"));
                continue;
            }
            (Some(m), false) => {
                failures.push(m);
                continue;
            }
            (None, false) => {}
        }
        match newer {
            None if got.len() != compared.len() => failures.push(format!(
                "{name}: {} lines, expected {}",
                got.len(),
                compared.len()
            )),
            None => full += 1,
            Some(at) => {
                let offset = expected
                    .lines()
                    .nth(at)
                    .and_then(|l| l.split_whitespace().next())
                    .unwrap();
                let want = format!(
                    "[{}: error decoding packet:",
                    offset.trim_start_matches('0').to_owned().max("0".into())
                );
                match got.get(at) {
                    Some(have) if have.starts_with(&want) => prefix += 1,
                    have => failures.push(format!(
                        "{name}: line {}: want libipt 2.0.5 to fail with `{want} …`, got {have:?}",
                        at + 1
                    )),
                }
            }
        }
    }
    eprintln!(
        "ptdump corpus: {full} cases fully equal, {prefix} equal up to a post-2.0.5 packet, \
         {known_diff} known 2.0.5 differences, {unknown_cpu} skipped (cpu unknown to 2.0.5), \
         {skipped} skipped (options)"
    );
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(full > 300, "only {full} cases compared in full");
}
