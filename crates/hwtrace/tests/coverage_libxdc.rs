//! `hwtrace coverage --afl-map` against libxdc, the Intel PT decoder of
//! kAFL/Nyx, on the real hardware traces of `../shared/corpus/real`:
//!
//! - the hash libxdc gave each trace's bitmap (`case.json`'s
//!   `libxdc_bitmap_hash`, libxdc's `libxdc_bitmap_get_hash`) is the one
//!   the summary prints and the one of the map written, with one decode
//!   thread and with two;
//! - the map is, counter for counter (at 64 KiB and at 1 MiB), the one
//!   libxdc's own edge list (`reference/libxdc-edges.txt`, written by its
//!   trace mode) gives when only the edges out of conditional branches
//!   are counted, as libxdc's bitmap mode counts them (the branches found
//!   by classifying the source instruction from the page cache; the
//!   list's `ffffffffffffffff` ends, tracing switched on or off, left
//!   out).
//!
//! `--lenient` reads tracing's on/off status as libxdc does (these traces'
//! PSB+ after a VM exit say tracing is on where it was off).

mod common;

use anyhow::{Context, Result, ensure};
use hwtrace_flow::insn::{InsnClass, read_insn};
use hwtrace_mem::pagecache::PageCache;
use hwtrace_packet::ExecMode;
use hwtrace_report::coverage::afl;
use hwtrace_types::{AddressSpace, Ip};
use std::path::{Path, PathBuf};
use std::process::Command;

const CASES: [&str; 3] = ["foo", "Unzip", "icelake_tip"];

fn case_dir(name: &str) -> PathBuf {
    common::shared().join("real").join(name)
}

/// libxdc's hash of the case's bitmap, from `case.json`.
fn libxdc_hash(dir: &Path) -> Result<u64> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("case.json"))?)?;
    let text = v["libxdc_bitmap_hash"]
        .as_str()
        .context("case.json: libxdc_bitmap_hash")?;
    Ok(u64::from_str_radix(text.trim_start_matches("0x"), 16)?)
}

/// The map of `size` bytes libxdc's bitmap mode fills, from its trace
/// mode's edge list: the edges whose source instruction is a conditional
/// branch.
fn map_from_libxdc_edges(dir: &Path, size: usize) -> Result<Vec<u8>> {
    let pages = PageCache::open_files(&dir.join("pages.addr"), &dir.join("pages.dump"))?;
    let list = std::fs::read_to_string(dir.join("reference/libxdc-edges.txt"))?;
    let mut map = vec![0u8; size];
    let mut counted = 0;
    for line in list.lines().filter(|l| !l.is_empty()) {
        let (from, to) = line.split_once("->").context("src->dst")?;
        let (from, to) = (u64::from_str_radix(from, 16)?, u64::from_str_radix(to, 16)?);
        if from == u64::MAX || to == u64::MAX {
            continue;
        }
        let insn = read_insn(&pages, AddressSpace::UNKNOWN, Ip(from), ExecMode::Bits64)
            .map_err(|e| anyhow::anyhow!("{from:#x}: {e:?}"))?;
        if insn.decoded.class == InsnClass::CondJump {
            let slot = &mut map[afl::edge_slot(Ip(from), Ip(to), size)];
            *slot = slot.wrapping_add(1);
            counted += 1;
        }
    }
    ensure!(counted > 0, "{}: no conditional branch", dir.display());
    Ok(map)
}

/// Runs `hwtrace coverage --lenient --afl-map` (with `extra`): the map and
/// the hash the summary prints.
fn coverage(dir: &Path, out: &Path, extra: &[&str]) -> Result<(Vec<u8>, u64)> {
    let run = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .arg("coverage")
        .arg(dir.join("trace.pt"))
        .arg("--pages")
        .arg(dir)
        .arg("--lenient")
        .arg("--afl-map")
        .arg(out)
        .args(extra)
        .output()?;
    let summary = String::from_utf8(run.stdout)?;
    ensure!(
        run.status.success(),
        "{}: {:?}: {}{summary}",
        dir.display(),
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let hash = summary
        .lines()
        .find_map(|l| l.split_once("libxdc hash 0x"))
        .with_context(|| format!("no libxdc hash in {summary}"))?
        .1;
    Ok((std::fs::read(out)?, u64::from_str_radix(hash.trim(), 16)?))
}

#[test]
fn afl_maps_are_libxdcs_on_real_traces() -> Result<()> {
    let scratch = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-libxdc-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let result = (|| -> Result<()> {
        for name in CASES {
            let dir = case_dir(name);
            let want_hash = libxdc_hash(&dir)?;
            let want_map = map_from_libxdc_edges(&dir, afl::MAP_SIZE)?;
            ensure!(
                afl::libxdc_hash(&want_map) == want_hash,
                "{name}: libxdc's edge list and its hash disagree: the test's reading of libxdc is wrong"
            );
            for jobs in ["1", "2"] {
                let out = scratch.join(format!("{name}-{jobs}.afl"));
                let (map, printed) = coverage(&dir, &out, &["--jobs", jobs])?;
                let differ: Vec<_> = (0..afl::MAP_SIZE)
                    .filter(|&i| map[i] != want_map[i])
                    .take(5)
                    .map(|i| (i, map[i], want_map[i]))
                    .collect();
                ensure!(
                    differ.is_empty(),
                    "{name} --jobs {jobs}: counters (index, ours, libxdc's) {differ:?}"
                );
                ensure!(
                    printed == want_hash && afl::libxdc_hash(&map) == want_hash,
                    "{name} --jobs {jobs}: hash {printed:#x}, libxdc's {want_hash:#x}"
                );
            }
            // A map of 1 MiB, as a Nyx target may use: libxdc's edges at
            // the wider index.
            let out = scratch.join(format!("{name}-1m.afl"));
            let (big, printed) = coverage(&dir, &out, &["--afl-map-size", "1M"])?;
            ensure!(
                big == map_from_libxdc_edges(&dir, 1 << 20)? && printed == afl::libxdc_hash(&big),
                "{name}: the 1 MiB map differs from libxdc's edges"
            );
            // Every edge, not libxdc's map: another hash.
            let out = scratch.join(format!("{name}-all.afl"));
            let (all, printed) = coverage(&dir, &out, &["--afl-edges", "all"])?;
            ensure!(
                all != want_map && printed != want_hash,
                "{name}: --afl-edges all gave libxdc's map"
            );
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// Read as libipt reads it (no `--lenient`), Unzip's PSB+ after VM exits
/// are errors, each skipping to the next PSB: the map is not libxdc's, and
/// the command says which option reads the trace as libxdc does.
#[test]
fn strict_decoding_names_the_option_libxdc_reads_by() -> Result<()> {
    let dir = case_dir("Unzip");
    let run = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .arg("coverage")
        .arg(dir.join("trace.pt"))
        .arg("--pages")
        .arg(&dir)
        .output()?;
    let (summary, stderr) = (
        String::from_utf8(run.stdout)?,
        String::from_utf8(run.stderr)?,
    );
    ensure!(run.status.code() == Some(2), "{:?}: {stderr}", run.status);
    ensure!(
        stderr.contains("are PSB+ saying tracing is on where it was off")
            && stderr.contains("--lenient"),
        "no hint: {stderr}"
    );
    let want = format!("libxdc hash {:#018x}", libxdc_hash(&dir)?);
    ensure!(
        summary.contains("libxdc hash") && !summary.contains(&want),
        "{summary}"
    );
    Ok(())
}

/// What the library decodes a real case from: its page cache as an
/// image, its trace, and tracing's status read as libxdc reads it.
fn library_input(name: &str) -> Result<(hwtrace_mem::image::Image, Vec<u8>, hwtrace_flow::Config)> {
    let dir = case_dir(name);
    let pages = PageCache::open_files(&dir.join("pages.addr"), &dir.join("pages.dump"))?;
    let mut image = hwtrace_mem::image::Image::new();
    image.add_page_cache(None, pages, name);
    let config = hwtrace_flow::Config {
        lenient_status: true,
        ..hwtrace_flow::Config::default()
    };
    Ok((image, std::fs::read(dir.join("trace.pt"))?, config))
}

/// The library's [`LibxdcMap`](hwtrace_report::coverage::libxdc::LibxdcMap),
/// as a fuzzer would use it (one trace per execution, the code learned
/// kept between them): libxdc's hash and map on each real trace, the same
/// outcomes counted again for the same trace a second time (every counter
/// doubled, with the code no longer disassembled), and a map cleared and
/// code forgotten on request.
#[test]
fn the_library_map_is_libxdcs_trace_after_trace() -> Result<()> {
    use hwtrace_report::coverage::libxdc::{LibxdcMap, MapSizeError};

    ensure!(LibxdcMap::new(1000).err() == Some(MapSizeError(1000)));
    for name in CASES {
        let dir = case_dir(name);
        let (image, trace, config) = library_input(name)?;
        let mut map = LibxdcMap::new(afl::MAP_SIZE)?;
        let first = map.decode(&trace, config, &image);
        let want = map_from_libxdc_edges(&dir, afl::MAP_SIZE)?;
        ensure!(
            map.map() == want.as_slice() && map.hash() == libxdc_hash(&dir)?,
            "{name}: hash {:#x}, libxdc's {:#x}",
            map.hash(),
            libxdc_hash(&dir)?
        );
        ensure!(
            first.edges > 0 && first.insns > first.edges,
            "{name}: {first:?}"
        );
        let known = map.known_blocks();
        ensure!(known > 0, "{name}: no code learned");
        let second = map.decode(&trace, config, &image);
        ensure!(
            second == first,
            "{name}: {second:?} the second time, {first:?} the first"
        );
        ensure!(map.known_blocks() == known, "{name}: code learned again");
        let doubled: Vec<u8> = want.iter().map(|c| c.wrapping_mul(2)).collect();
        ensure!(
            map.map() == doubled.as_slice(),
            "{name}: not every counter doubled"
        );
        map.reset_map();
        ensure!(map.map().iter().all(|&c| c == 0));
        map.forget_code();
        ensure!(map.known_blocks() == 0);
        ensure!(map.decode(&trace, config, &image) == first);
        ensure!(
            map.map() == want.as_slice(),
            "{name}: after forgetting the code"
        );
    }
    Ok(())
}

/// The library's edges ([`LibxdcMap::decode_with_edges`]) are libxdc's
/// trace mode's, line for line, on each real trace: every branch to the
/// next instruction (a conditional branch's fall-through too), and
/// `ffffffffffffffff` where tracing is switched on and off.
///
/// [`LibxdcMap::decode_with_edges`]: hwtrace_report::coverage::libxdc::LibxdcMap::decode_with_edges
#[test]
fn the_library_edges_are_libxdcs_trace_mode_list() -> Result<()> {
    use hwtrace_report::coverage::libxdc::LibxdcMap;

    for name in CASES {
        let dir = case_dir(name);
        let (image, trace, config) = library_input(name)?;
        let mut map = LibxdcMap::new(afl::MAP_SIZE)?;
        let mut ours = Vec::new();
        map.decode_with_edges(&trace, config, &image, |from, to| {
            ours.push(format!("{from:x}->{to:x}"))
        });
        let want = std::fs::read_to_string(dir.join("reference/libxdc-edges.txt"))?;
        let want: Vec<&str> = want.lines().filter(|l| !l.is_empty()).collect();
        if let Some(i) = (0..ours.len().max(want.len()))
            .find(|&i| ours.get(i).map(String::as_str) != want.get(i).copied())
        {
            let from = i.saturating_sub(3);
            anyhow::bail!(
                "{name}: edge {i} of {} (libxdc's {}) differs:\nours   {:?}\nlibxdc {:?}",
                ours.len(),
                want.len(),
                &ours[from.min(ours.len())..(i + 4).min(ours.len())],
                &want[from.min(want.len())..(i + 4).min(want.len())]
            );
        }
        // The map is still libxdc's bitmap.
        ensure!(
            map.hash() == libxdc_hash(&dir)?,
            "{name}: hash {:#x}",
            map.hash()
        );
    }
    Ok(())
}

/// `hwtrace coverage --libxdc-edges` writes libxdc's trace-mode edge list
/// of each real trace, byte for byte.
#[test]
fn coverage_writes_libxdcs_edge_list() -> Result<()> {
    let scratch = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-libxdc-edges-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let result = (|| -> Result<()> {
        for name in CASES {
            let dir = case_dir(name);
            let out = scratch.join(format!("{name}.edges"));
            let map = scratch.join(format!("{name}.afl"));
            coverage(
                &dir,
                &map,
                &["--libxdc-edges", out.to_str().context("utf-8")?],
            )?;
            let want = std::fs::read(dir.join("reference/libxdc-edges.txt"))?;
            ensure!(
                std::fs::read(&out)? == want,
                "{name}: the edge list differs from libxdc's"
            );
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// libxdc decodes raw PT: the edge list of a perf.data file is refused,
/// saying what to give instead.
#[test]
fn libxdc_edges_need_a_raw_trace() {
    let perf = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/perf/pt-true.data"
    );
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-libxdc-perf-{}", std::process::id()));
    let err = common::fails(&["coverage", perf, "--libxdc-edges", out.to_str().unwrap()]);
    assert!(
        err.contains("--libxdc-edges: libxdc decodes raw Intel PT"),
        "{err}"
    );
    let _ = std::fs::remove_file(&out);
}

/// A conditional branch that leaves the IP filter writes no TNT bit, only
/// a TIP.PGD without an address: libxdc's walk stops at the branch, so it
/// is no edge and no counter, and the disable's edge starts at the last
/// address the trace gave (the enable's). The other outcomes count.
#[test]
fn a_conditional_branch_leaving_the_filter_is_no_edge() -> Result<()> {
    use hwtrace_mem::image::Image;
    use hwtrace_report::coverage::libxdc::LibxdcMap;
    use hwtrace_sim::{CodeImageBuilder, Execution, IpRange, PtConfig, PtEncoder};

    // 0x1000: jz 0x2000 (outside the filter); 0x2000: jmp 0x1006;
    // 0x1006: nop; 0x1007: jz 0x100b; 0x1009: nop; nop; 0x100b: nop.
    let mut code = vec![0x90u8; 0x1010];
    code[..6].copy_from_slice(&[0x0f, 0x84, 0xfa, 0x0f, 0x00, 0x00]);
    code[7..9].copy_from_slice(&[0x74, 0x02]);
    code[0x1000..0x1005].copy_from_slice(&[0xe9, 0x01, 0xf0, 0xff, 0xff]);
    let mut mem = CodeImageBuilder::new();
    mem.add(Ip(0x1000), &code)
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let insns = [0x1000, 0x2000, 0x1006, 0x1007, 0x100b].map(Ip).to_vec();
    let execution = Execution::from_parts(
        insns,
        ExecMode::Bits64,
        mem.build().map_err(|e| anyhow::anyhow!("{e:?}"))?,
        None,
    );
    let mut config = PtConfig::default();
    config.ip_filter[0] = Some(IpRange {
        start: Ip(0x1000),
        end: Ip(0x1fff),
    });
    let trace = PtEncoder::new(config).encode(&execution)?.bytes;

    let mut image = Image::new();
    image.add_bytes(None, Ip(0x1000), code.clone(), "code")?;
    let mut map = LibxdcMap::new(afl::MAP_SIZE)?;
    let mut edges = Vec::new();
    let summary = map.decode_with_edges(&trace, hwtrace_flow::Config::default(), &image, |f, t| {
        edges.push(format!("{f:x}->{t:x}"))
    });
    // (What follows is the trace's end: a FUP and a TIP.PGD at 0x100c,
    // which libxdc's walk from there passes on to the jump at 0x2000.)
    ensure!(
        edges.starts_with(&[
            "ffffffffffffffff->1000".to_string(),
            "1000->ffffffffffffffff".to_string(),
            "ffffffffffffffff->1006".to_string(),
            "1007->100b".to_string(),
        ]) && !edges.contains(&"1000->2000".to_string()),
        "{edges:?} ({summary:?})"
    );
    let mut want = vec![0u8; afl::MAP_SIZE];
    want[afl::edge_slot(Ip(0x1007), Ip(0x100b), afl::MAP_SIZE)] = 1;
    ensure!(
        map.map() == want.as_slice() && summary.edges == 1,
        "{summary:?}"
    );

    // `hwtrace coverage`, from its blocks and edges: the same map (its
    // edge from 0x1000 to where tracing came back is kept, not counted).
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-libxdc-filter-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = (|| -> Result<()> {
        let (pt, bin, afl_map) = (dir.join("t.pt"), dir.join("code.bin"), dir.join("t.afl"));
        std::fs::write(&pt, &trace)?;
        std::fs::write(&bin, &code)?;
        let out = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
            .arg("coverage")
            .arg(&pt)
            .arg("--image")
            .arg(format!("{}@0x1000", bin.display()))
            .arg("--afl-map")
            .arg(&afl_map)
            .output()?;
        ensure!(out.status.success(), "{out:?}");
        ensure!(
            std::fs::read(&afl_map)? == want,
            "coverage's map is not libxdc's"
        );
        // ptxed (both decoders) follows the flow on past the branch that
        // left the filter: the instructions in the filter, in order, and
        // no error (libipt 2.0.5's instruction decoder stops there).
        for decoder in [None, Some("--insn-decoder")] {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_hwtrace"));
            cmd.arg("ptxed")
                .arg("--pt")
                .arg(&pt)
                .arg("--raw")
                .arg(format!("{}:0x1000", bin.display()));
            cmd.args(decoder);
            let out = cmd.output()?;
            let text = String::from_utf8_lossy(&out.stdout);
            ensure!(out.status.success() && !text.contains("error"), "{out:?}");
            let ips: Vec<&str> = text
                .lines()
                .filter_map(|l| l.split_whitespace().next())
                .filter(|w| w.starts_with("000000000000"))
                .collect();
            ensure!(
                ips == [
                    "0000000000001000",
                    "0000000000001006",
                    "0000000000001007",
                    "000000000000100b"
                ],
                "{decoder:?}: {text}"
            );
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// `hwtrace libxdc` over several traces of one target: each trace's hash
/// is libxdc's, a trace seen before (here the same trace LZ4-compressed,
/// as kAFL saves it) sets no new counter and says so, and `--edges` writes
/// libxdc's edge list of each.
#[test]
fn libxdc_command_hashes_trace_after_trace() -> Result<()> {
    let scratch = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-libxdc-cmd-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let result = (|| -> Result<()> {
        for name in CASES {
            let dir = case_dir(name);
            let plain = dir.join("trace.pt");
            let packed = scratch.join(format!("{name}.pt.lz4"));
            let status = Command::new("lz4")
                .args(["-q", "-f"])
                .arg(&plain)
                .arg(&packed)
                .status()
                .context("lz4 (Debian package lz4, scripts/setup.sh)")?;
            ensure!(status.success());
            let edges = scratch.join(format!("{name}-edges"));
            let out = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
                .args(["libxdc", "--lenient", "--json", "--pages"])
                .arg(&dir)
                .arg(&plain)
                .arg(&packed)
                .arg("--edges")
                .arg(&edges)
                .output()?;
            ensure!(out.status.success(), "{name}: {out:?}");
            let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)?
                .lines()
                .map(serde_json::from_str)
                .collect::<Result<_, _>>()?;
            ensure!(lines.len() == 2, "{name}: {lines:?}");
            let want = format!("{:#018x}", libxdc_hash(&dir)?);
            for (line, first) in lines.iter().zip([true, false]) {
                ensure!(line["hash"] == want.as_str(), "{name}: {line}");
                ensure!(line["first_with_hash"] == first, "{name}: {line}");
                ensure!(line["errors"] == 0, "{name}: {line}");
            }
            let set = lines[0]["counters_set"].as_u64().context("counters_set")?;
            ensure!(lines[0]["counters_new"] == set, "{name}: {}", lines[0]);
            ensure!(lines[1]["counters_new"] == 0, "{name}: {}", lines[1]);
            let reference = std::fs::read(dir.join("reference/libxdc-edges.txt"))?;
            for file in ["trace.pt.edges", &format!("{name}.pt.lz4.edges")] {
                ensure!(
                    std::fs::read(edges.join(file))? == reference,
                    "{name}: {file} is not libxdc's edge list"
                );
            }
        }
        // Strict decoding of a trace with VM exits: errors, exit code 2,
        // and the option that reads the trace as libxdc does.
        let unzip = case_dir("Unzip");
        let out = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
            .args(["libxdc", "--pages"])
            .arg(&unzip)
            .arg(unzip.join("trace.pt"))
            .output()?;
        ensure!(out.status.code() == Some(2), "{out:?}");
        ensure!(String::from_utf8(out.stderr)?.contains("--lenient"));
        // Two threads report what one does, in the order given: the same
        // lines, the first of each hash the first given, new counters
        // only there.
        let foo = case_dir("foo");
        let mut traces = Vec::new();
        for name in CASES {
            traces.push(case_dir(name).join("trace.pt"));
            traces.push(foo.join("trace.pt"));
        }
        let mut outputs = Vec::new();
        for jobs in ["1", "2"] {
            let out = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
                .args(["libxdc", "--lenient", "--jobs", jobs, "--pages"])
                .arg(&foo)
                .args(&traces)
                .output()?;
            outputs.push((out.status.code(), String::from_utf8(out.stdout)?));
        }
        ensure!(
            outputs[0] == outputs[1],
            "--jobs 1 and --jobs 2 differ:\n{}\n---\n{}",
            outputs[0].1,
            outputs[1].1
        );
        let lines: Vec<&str> = outputs[0].1.lines().collect();
        ensure!(lines.len() == traces.len() + 1, "{lines:?}");
        ensure!(
            !lines[0].contains("(seen)")
                && lines[1].contains("(seen)")
                && lines[3].contains("(seen)")
        );
        // A trace that cannot be read is named; the others are decoded.
        let missing = scratch.join("missing.pt");
        let out = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
            .args(["libxdc", "--lenient", "--pages"])
            .arg(&foo)
            .arg(&missing)
            .arg(foo.join("trace.pt"))
            .output()?;
        ensure!(out.status.code() == Some(2), "{out:?}");
        let stdout = String::from_utf8(out.stdout)?;
        ensure!(
            String::from_utf8(out.stderr)?.contains(&missing.display().to_string())
                && stdout.contains(&format!("hash {:#018x}", libxdc_hash(&foo)?))
                && stdout.contains("1 traces unreadable"),
            "{stdout}"
        );
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    result
}
